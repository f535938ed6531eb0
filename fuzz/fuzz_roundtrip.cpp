// libFuzzer target: builds a Message from the fuzz input, encodes it, reads the bytes back
// through the network's decode chain and requires the same message. Nothing may throw here:
// every generated message is one the agent could legitimately send.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <exception>

#include "core/storage.h"
#include "fuzz/support.h"

namespace {

using gw::Tensor;
using gw::rpc::IValue;
using gw::rpc::Message;
using gw::rpc::Request;

constexpr int kMaxDepth = 16;    // far below the decoder's nesting limit (64)
constexpr size_t kMaxItems = 8;  // per list / argument list
constexpr int64_t kMaxDimSize = 8;

class Generator {
 public:
  explicit Generator(FuzzedDataProvider& in) : in_(in) {}

  Message message() {
    Message m;
    m.id = in_.ConsumeIntegral<uint64_t>();
    switch (in_.ConsumeIntegralInRange<int>(0, 12)) {
      case 0:
        m.body = gw::rpc::Handshake{
            in_.ConsumeIntegral<uint32_t>(), text(), in_.ConsumeIntegral<int32_t>(), {}};
        if (in_.ConsumeBool()) {
          auto& shm = m.get<gw::rpc::Handshake>()->shm.emplace();
          shm.step =
              static_cast<gw::rpc::SharedMemory::Step>(in_.ConsumeIntegralInRange<int>(0, 3));
          shm.host = text();
          shm.pid = in_.ConsumeIntegral<int32_t>();
          shm.fd = in_.ConsumeIntegral<int32_t>();
          shm.ring_bytes = in_.ConsumeIntegral<uint64_t>();
          shm.token = text();
        }
        m.device_map.resize(in_.ConsumeIntegralInRange<size_t>(0, 4));
        for (auto& [from, to] : m.device_map)  // int16 on the wire
          from = in_.ConsumeIntegral<int16_t>(), to = in_.ConsumeIntegral<int16_t>();
        break;
      case 1:
        m.body = gw::rpc::Response{value(0), std::nullopt};
        break;
      case 2:
        m.body = gw::rpc::Response{
            IValue(), gw::rpc::Failure{text(), text(),
                                       static_cast<gw::ErrorCode>(in_.ConsumeIntegralInRange<int>(
                                           0, static_cast<int>(gw::ErrorCode::kInternal)))}};
        break;
      case 3:
        m.body = Request(gw::rpc::Call{text(), list(0)});
        break;
      case 4:
        m.body = Request(gw::rpc::RRefCreate{id(), id(), text(), list(0)});
        break;
      case 5:
        m.body = Request(gw::rpc::RRefFetch{id()});
        break;
      case 6:
        m.body = Request(gw::rpc::RRefFork{id(), id()});
        break;
      case 7:
        m.body = Request(gw::rpc::RRefAccept{id()});
        break;
      case 8:
        m.body = Request(gw::rpc::RRefDelete{id(), id()});
        break;
      case 9: {
        gw::rpc::AutogradGradients g{in_.ConsumeIntegral<uint64_t>(),
                                     in_.ConsumeIntegral<uint64_t>(),
                                     in_.ConsumeIntegral<uint64_t>(),
                                     in_.ConsumeBool(),
                                     {},
                                     in_.ConsumeBool(),
                                     in_.ConsumeBool()};
        g.grads.resize(in_.ConsumeIntegralInRange<size_t>(0, kMaxItems));
        for (auto& t : g.grads)
          if (in_.ConsumeBool()) t = tensor();
        m.body = Request(std::move(g));
        break;
      }
      case 10: {
        gw::rpc::AutogradDiscover d{in_.ConsumeIntegral<uint64_t>(),
                                    in_.ConsumeIntegral<uint64_t>(),
                                    in_.ConsumeBool(),
                                    {},
                                    in_.ConsumeBool()};
        d.message_ids.resize(in_.ConsumeIntegralInRange<size_t>(0, kMaxItems));
        for (auto& id : d.message_ids) id = in_.ConsumeIntegral<uint64_t>();
        m.body = Request(std::move(d));
        break;
      }
      case 11: {
        gw::rpc::AutogradRelease r;
        r.context_ids.resize(in_.ConsumeIntegralInRange<size_t>(0, kMaxItems));
        for (auto& c : r.context_ids) c = in_.ConsumeIntegral<uint64_t>();
        m.body = Request(std::move(r));
        break;
      }
      default:
        m.body = Request(gw::rpc::AutogradBackward{
            IValue::rref_fork(rref_fork()), in_.ConsumeIntegral<uint64_t>(), in_.ConsumeBool()});
        break;
    }
    if (!m.get<gw::rpc::Handshake>() && in_.ConsumeBool())
      m.autograd =
          gw::rpc::AutogradInfo{in_.ConsumeIntegral<uint64_t>(), in_.ConsumeIntegral<uint64_t>()};
    return m;
  }

 private:
  // May hold NUL bytes, which rpc/message.cpp must keep (this target once found it cut them).
  std::string text() { return in_.ConsumeRandomLengthString(64); }

  gw::rpc::IValueList list(int depth) {
    gw::rpc::IValueList l(in_.ConsumeIntegralInRange<size_t>(0, kMaxItems));
    for (auto& v : l) v = value(depth + 1);
    return l;
  }

  IValue value(int depth) {
    switch (in_.ConsumeIntegralInRange<int>(0, depth < kMaxDepth ? 8 : 7)) {
      case 0:
        return IValue();
      case 1:
        return IValue(in_.ConsumeBool());
      case 2:
        return IValue(in_.ConsumeIntegral<int64_t>());
      case 3: {
        // Any bit pattern, NaN payloads included: the wire must carry doubles bit for bit.
        uint64_t bits = in_.ConsumeIntegral<uint64_t>();
        double d;
        std::memcpy(&d, &bits, sizeof d);
        return IValue(d);
      }
      case 4:
        return IValue(text());
      case 5:
        return IValue::bytes(in_.ConsumeBytes<uint8_t>(in_.ConsumeIntegralInRange(0, 64)));
      case 6:
        return IValue(tensor());
      case 7:
        return IValue::rref_fork(rref_fork());
      default:
        return IValue(list(depth));
    }
  }

  gw::rpc::GloballyUniqueId id() {
    return {in_.ConsumeIntegral<int32_t>(), in_.ConsumeIntegral<int64_t>()};
  }

  // Only forks travel: the agent turns local RRefs into forks before encoding.
  gw::rpc::RRefForkData rref_fork() {
    gw::rpc::RRefForkData d;
    d.owner = in_.ConsumeIntegral<int32_t>();
    d.rref_id = id();
    d.fork_id = id();
    d.parent = in_.ConsumeIntegral<int32_t>();
    return d;
  }

  Tensor tensor() {
    auto dtype = static_cast<gw::DType>(
        in_.ConsumeIntegralInRange<int>(0, static_cast<int>(gw::DType::Float64)));
    gw::Shape sizes(in_.ConsumeIntegralInRange<size_t>(0, 4));
    for (auto& s : sizes) s = in_.ConsumeIntegralInRange<int64_t>(0, kMaxDimSize);
    size_t nbytes = static_cast<size_t>(gw::numel(sizes)) * gw::itemsize(dtype);
    Tensor t = Tensor::make(gw::Storage::allocate(nbytes, gw::kCPU), sizes,
                            gw::contiguous_strides(sizes), 0, dtype);
    auto* p = static_cast<uint8_t*>(t.raw_data());
    std::vector<uint8_t> fill = in_.ConsumeBytes<uint8_t>(nbytes);
    if (nbytes > 0) std::memset(p, 0, nbytes);
    if (!fill.empty()) std::memcpy(p, fill.data(), fill.size());
    // Only 0 and 1 are bools; anything else is undefined behaviour once a kernel reads it.
    if (dtype == gw::DType::Bool)
      for (size_t i = 0; i < nbytes; ++i) p[i] &= 1;
    // A view: encode must send its elements in row-major order, not its storage.
    if (t.dim() >= 2 && in_.ConsumeBool()) t = t.transpose(0, t.dim() - 1);
    if (gw::is_floating(dtype) && in_.ConsumeBool()) t.requires_grad_(true);
    return t;
  }

  FuzzedDataProvider& in_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  try {
    Message m = Generator(in).message();
    std::vector<uint8_t> bytes = gw::fuzz::frame_bytes(gw::rpc::encode(m));
    auto decoded = gw::fuzz::read_frames(bytes, bytes.size());
    if (decoded.size() != 1)
      gw::fuzz::report_finding(gw::detail::str("one frame read back as ", decoded.size()));
    std::string diff = gw::fuzz::message_difference(m, decoded[0]);
    if (!diff.empty()) gw::fuzz::report_finding("encode -> decode changed the message: " + diff);
  } catch (const std::exception& e) {
    gw::fuzz::report_finding(std::string("round trip of a valid message threw: ") + e.what());
  } catch (...) {
    gw::fuzz::report_finding("round trip of a valid message threw a non-std::exception");
  }
  return 0;
}
