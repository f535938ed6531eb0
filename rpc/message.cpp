#include "rpc/message.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "core/trace.h"
#include "rpc/wire.capnp.h"

namespace gw::rpc {

static_assert(std::endian::native == std::endian::little, "the frame prefix is little endian");

namespace {

constexpr uint32_t kMagic = 0x31525747;  // "GWR1"
constexpr int kMaxNesting = 64;          // how deep values may nest (lists of lists ...)

// Text with its full length: strings may hold NUL bytes, which c_str() would cut off.
kj::StringPtr text(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }
std::string text(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }

// --- encoding -------------------------------------------------------------------------------

void set_id(wire::Id::Builder out, const GloballyUniqueId& id) {
  out.setWorker(id.worker);
  out.setLocal(id.local);
}
GloballyUniqueId id_of(wire::Id::Reader in) { return {in.getWorker(), in.getLocal()}; }

void write_fork(wire::RRefFork::Builder out, const RRefForkData& d) {
  out.setOwner(d.owner);
  set_id(out.initRrefId(), d.rref_id);
  set_id(out.initForkId(), d.fork_id);
  out.setParent(d.parent);
}
RRefForkData read_fork(wire::RRefFork::Reader in) {
  return {in.getOwner(), id_of(in.getRrefId()), id_of(in.getForkId()), in.getParent()};
}

void write_value(wire::Value::Builder out, const IValue& v, std::vector<Tensor>& tensors) {
  switch (v.kind()) {
    case IValue::Kind::kNone:
      out.setNone();
      break;
    case IValue::Kind::kBool:
      out.setBoolean(v.to_bool());
      break;
    case IValue::Kind::kInt:
      out.setInt(v.to_int());
      break;
    case IValue::Kind::kDouble:
      out.setFloat(v.to_double());
      break;
    case IValue::Kind::kString:
      out.setText(text(v.to_string()));
      break;
    case IValue::Kind::kTensor: {
      const Tensor& t = v.to_tensor();
      GW_CHECK(t.defined(), InvalidArgumentError, "[rpc] cannot send an undefined tensor");
      out.setTensor(static_cast<uint32_t>(tensors.size()));
      tensors.push_back(t);
      break;
    }
    case IValue::Kind::kList: {
      const IValueList& l = v.to_list();
      auto items = out.initList(static_cast<unsigned>(l.size()));
      for (size_t i = 0; i < l.size(); ++i) write_value(items[i], l[i], tensors);
      break;
    }
    case IValue::Kind::kBytes: {
      const Bytes& b = v.to_bytes();
      out.setBytes(kj::arrayPtr(b.data(), b.size()));
      break;
    }
    case IValue::Kind::kRRefFork:
      write_fork(out.initRref(), v.to_rref_fork());
      break;
    case IValue::Kind::kRRef:
      throw InternalError("[rpc] an RRef must be forked by the agent before it is sent");
    case IValue::Kind::kObject:
      throw InvalidArgumentError(gw::detail::str(
          "[rpc] cannot send an object of type ", v.to_object().type_name,
          " to another worker: objects stay on their owner; pass an RRef to it instead"));
  }
}

// The receiver's device for a tensor on `device`: -1 for the CPU, else the map's entry.
int target_device(Device device, const DeviceMap& map) {
  if (device.is_cpu()) return -1;
  for (const auto& [from, to] : map)
    if (from == device.index) return to;
  throw InvalidArgumentError(gw::detail::str(
      "[rpc] cannot send a tensor on ", device,
      ": the device map toward the receiver has no entry for it (set one with "
      "RpcBackendOptions::set_device_map, or move the tensor to the CPU)"));
}

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// --- decoding -------------------------------------------------------------------------------

IValue read_value(wire::Value::Reader in, const std::vector<Tensor>& tensors, int depth) {
  GW_CHECK(depth < kMaxNesting, IoError, "[rpc] value nested deeper than ", kMaxNesting);
  switch (in.which()) {
    case wire::Value::NONE:
      return IValue();
    case wire::Value::BOOLEAN:
      return IValue(in.getBoolean());
    case wire::Value::INT:
      return IValue(in.getInt());
    case wire::Value::FLOAT:
      return IValue(in.getFloat());
    case wire::Value::TEXT:
      return IValue(text(in.getText()));
    case wire::Value::TENSOR: {
      uint32_t i = in.getTensor();
      GW_CHECK(i < tensors.size(), IoError, "[rpc] value refers to tensor ", i, " of ",
               tensors.size());
      return IValue(tensors[i]);
    }
    case wire::Value::LIST: {
      IValueList l;
      for (auto item : in.getList()) l.push_back(read_value(item, tensors, depth + 1));
      return IValue(std::move(l));
    }
    case wire::Value::BYTES: {
      auto b = in.getBytes();
      return IValue::bytes(Bytes(b.begin(), b.end()));
    }
    case wire::Value::RREF:
      return IValue::rref_fork(read_fork(in.getRref()));
  }
  throw IoError(gw::detail::str("[rpc] unknown value kind ", static_cast<int>(in.which())));
}

capnp::ReaderOptions reader_options(size_t header_words) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = header_words * 2 + 64;  // a valid header is read at most ~twice
  o.nestingLimit = kMaxNesting + 8;
  return o;
}

IoError malformed(const kj::Exception& e) {
  return IoError(gw::detail::str("[rpc] malformed message header: ", e.getDescription().cStr()));
}

// Runs `f`, turning Cap'n Proto's exceptions about malformed bytes into gw::IoError.
template <typename F>
auto guard_capnp(F&& f) {
  try {
    return f();
  } catch (const kj::Exception& e) {
    throw malformed(e);
  }
}

}  // namespace

size_t OutgoingFrame::total_bytes() const {
  size_t n = prefix.size() + header.size() * sizeof(capnp::word);
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

namespace {
void write_values(capnp::List<wire::Value>::Builder out, const IValueList& values,
                  std::vector<Tensor>& tensors) {
  for (size_t i = 0; i < values.size(); ++i)
    write_value(out[static_cast<unsigned>(i)], values[i], tensors);
}

// Writes request `r` into the envelope's body, appending the tensors it carries.
void write_request(wire::Envelope::Body::Builder body, const Request& r,
                   std::vector<Tensor>& tensors) {
  auto count = [](const auto& list) { return static_cast<unsigned>(list.size()); };
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Call>) {
          auto c = body.initCall();
          c.setFunction(text(m.function));
          write_values(c.initArgs(count(m.args)), m.args, tensors);
        } else if constexpr (std::is_same_v<T, RRefCreate>) {
          auto c = body.initRrefCreate();
          set_id(c.initRrefId(), m.rref_id);
          set_id(c.initForkId(), m.fork_id);
          c.setFunction(text(m.function));
          write_values(c.initArgs(count(m.args)), m.args, tensors);
        } else if constexpr (std::is_same_v<T, RRefFetch>) {
          set_id(body.initRrefFetch(), m.rref_id);
        } else if constexpr (std::is_same_v<T, RRefFork> || std::is_same_v<T, RRefDelete>) {
          auto ids = std::is_same_v<T, RRefFork> ? body.initRrefFork() : body.initRrefDelete();
          set_id(ids.initRrefId(), m.rref_id);
          set_id(ids.initForkId(), m.fork_id);
        } else if constexpr (std::is_same_v<T, RRefAccept>) {
          set_id(body.initRrefAccept(), m.fork_id);
        } else if constexpr (std::is_same_v<T, AutogradGradients>) {
          auto g = body.initAutogradGradients();
          g.setContextId(m.context_id);
          g.setMessageId(m.message_id);
          g.setPassId(m.pass_id);
          g.setRetainGraph(m.retain_graph);
          g.setReturned(m.returned);
          g.setSmart(m.smart);
          auto grads = g.initGrads(count(m.grads));
          for (size_t i = 0; i < m.grads.size(); ++i)
            write_value(grads[static_cast<unsigned>(i)],
                        m.grads[i].defined() ? IValue(m.grads[i]) : IValue(), tensors);
        } else if constexpr (std::is_same_v<T, AutogradDiscover>) {
          auto d = body.initAutogradDiscover();
          d.setContextId(m.context_id);
          d.setPassId(m.pass_id);
          d.setRetainGraph(m.retain_graph);
          d.setClosed(m.closed);
          auto ids = d.initMessageIds(count(m.message_ids));
          for (size_t i = 0; i < m.message_ids.size(); ++i)
            ids.set(static_cast<unsigned>(i), m.message_ids[i]);
        } else if constexpr (std::is_same_v<T, AutogradRelease>) {
          auto ids = body.initAutogradRelease(count(m.context_ids));
          for (size_t i = 0; i < m.context_ids.size(); ++i)
            ids.set(static_cast<unsigned>(i), m.context_ids[i]);
        } else if constexpr (std::is_same_v<T, AutogradBackward>) {
          auto b = body.initAutogradBackward();
          b.setContextId(m.context_id);
          b.setRetainGraph(m.retain_graph);
          GW_CHECK(m.rref.is(IValue::Kind::kRRefFork), InternalError,
                   "[rpc] an RRef must be forked by the agent before it is sent");
          write_fork(b.initRref(), m.rref.to_rref_fork());
        }
      },
      r);
}
}  // namespace

void set_failure(Response& r, const std::string& worker, const std::exception& e) {
  const Error* err = dynamic_cast<const Error*>(&e);
  r.value = IValue();
  r.error = Failure{worker, e.what(), err ? err->code() : ErrorCode::kRemote};
}

std::string describe(const Request& r) {
  return std::visit(
      [](const auto& m) -> std::string {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Call>)
          return "call of '" + m.function + "'";
        else if constexpr (std::is_same_v<T, RRefCreate>)
          return "remote() of '" + m.function + "'";
        else if constexpr (std::is_same_v<T, RRefFetch>)
          return "RRef fetch";
        else if constexpr (std::is_same_v<T, RRefFork>)
          return "RRef fork";
        else if constexpr (std::is_same_v<T, RRefAccept>)
          return "RRef accept";
        else if constexpr (std::is_same_v<T, RRefDelete>)
          return "RRef delete";
        else if constexpr (std::is_same_v<T, AutogradGradients>)
          return "distributed autograd gradients";
        else if constexpr (std::is_same_v<T, AutogradDiscover>)
          return "distributed autograd discovery";
        else if constexpr (std::is_same_v<T, AutogradRelease>)
          return "distributed autograd release";
        else
          return "RRef backward";
      },
      r);
}

OutgoingFrame encode(const Message& m, uint64_t cuda_ipc_lease) {
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  env.setId(m.id);
  OutgoingFrame frame;
  auto body = env.initBody();
  if (const auto* h = m.get<Handshake>()) {
    auto out = body.initHandshake();
    out.setProtocolVersion(h->protocol_version);
    out.setWorkerName(text(h->worker_name));
    out.setWorkerId(h->worker_id);
    auto pairs = out.initDeviceMap(static_cast<unsigned>(m.device_map.size()));
    for (size_t i = 0; i < m.device_map.size(); ++i) {
      pairs[static_cast<unsigned>(i)].setFrom(static_cast<int16_t>(m.device_map[i].first));
      pairs[static_cast<unsigned>(i)].setTo(static_cast<int16_t>(m.device_map[i].second));
    }
    if (h->shm) {
      auto shm = out.initShm();
      shm.setStep(static_cast<uint8_t>(h->shm->step));
      shm.setHost(text(h->shm->host));
      shm.setPid(h->shm->pid);
      shm.setFd(h->shm->fd);
      shm.setRingBytes(h->shm->ring_bytes);
      shm.setToken(kj::arrayPtr(reinterpret_cast<const kj::byte*>(h->shm->token.data()),
                                h->shm->token.size()));
    }
    auto released = out.initCudaIpcReleased(static_cast<unsigned>(h->cuda_ipc_released.size()));
    for (size_t i = 0; i < h->cuda_ipc_released.size(); ++i)
      released.set(static_cast<unsigned>(i), h->cuda_ipc_released[i]);
  } else if (const auto* r = m.get<Response>()) {
    auto out = body.initResponse();
    if (r->error) {
      auto e = out.initError();
      e.setWorker(text(r->error->worker));
      e.setMessage(text(r->error->message));
      e.setCode(static_cast<uint16_t>(r->error->code));
    } else {
      write_value(out.initValue(), r->value, frame.tensors);
    }
  } else {
    write_request(body, *m.request(), frame.tensors);
  }
  if (m.autograd) {
    auto a = env.initAutograd();
    a.setContextId(m.autograd->context_id);
    a.setMessageId(m.autograd->message_id);
  }
  auto metas = env.initTensors(static_cast<unsigned>(frame.tensors.size()));
  uint64_t payload = 0;
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    Tensor& t = frame.tensors[i];
    const bool requires_grad = t.requires_grad();
    const int device = target_device(t.device(), m.device_map);
    auto meta = metas[static_cast<unsigned>(i)];
    meta.setDevice(static_cast<int16_t>(device));
    meta.setDtype(static_cast<uint8_t>(t.dtype()));
    auto sizes = meta.initSizes(static_cast<unsigned>(t.dim()));
    for (int64_t d = 0; d < t.dim(); ++d) sizes.set(static_cast<unsigned>(d), t.size(d));
    meta.setRequiresGrad(requires_grad);
    std::optional<SharedCudaTensor> shared;
    if (device >= 0 && cuda_ipc_lease != 0 && cuda_ipc_shareable(t)) {
      try {  // another process of this host copies it out of our device memory
        shared = share_cuda_tensor(t, frame.lease);  // a contiguous snapshot
      } catch (const CudaError&) {  // none could be made or shared (out of memory): as bytes
      }
    }
    if (shared) {
      auto out = meta.initShared();
      out.setMemory(kj::arrayPtr(shared->memory.data(), shared->memory.size()));
      out.setOffset(shared->offset);
      t = Tensor::make(Storage::allocate(0, kCPU), {0}, {1}, 0, t.dtype());  // no payload bytes
    } else {
      // The payload is row-major host memory; views are sent as their own elements only.
      t = device >= 0 ? t.detach().to(kCPU) : t.contiguous();
    }
    payload += t.nbytes();
  }
  if (!frame.lease.empty()) env.setCudaIpcLease(cuda_ipc_lease);
  frame.header = capnp::messageToFlatArray(builder);
  put_u32(frame.prefix.data(), kMagic);
  put_u32(frame.prefix.data() + 4, static_cast<uint32_t>(frame.header.size() * 8));
  put_u64(frame.prefix.data() + 8, payload);
  return frame;
}

OutgoingFrame heartbeat_frame() {
  OutgoingFrame frame;
  put_u32(frame.prefix.data(), kMagic);  // no header, no payload
  return frame;
}

FramePrefix parse_prefix(const uint8_t* bytes, uint64_t max_frame_bytes) {
  uint32_t magic;
  FramePrefix p;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&p.header_bytes, bytes + 4, 4);
  std::memcpy(&p.payload_bytes, bytes + 8, 8);
  GW_CHECK(magic == kMagic, IoError, "[rpc] bad frame magic 0x", std::hex, magic,
           " (not a gradwire RPC peer?)");
  if (p.header_bytes == 0 && p.payload_bytes == 0) return p;  // a heartbeat
  GW_CHECK(p.header_bytes > 0 && p.header_bytes % 8 == 0, IoError, "[rpc] bad header size ",
           p.header_bytes, " (must be a positive multiple of 8)");
  GW_CHECK(p.header_bytes <= max_frame_bytes && p.payload_bytes <= max_frame_bytes - p.header_bytes,
           IoError, "[rpc] frame of ", p.header_bytes, " + ", p.payload_bytes,
           " bytes exceeds the maximum frame size ", max_frame_bytes);
  return p;
}

namespace {
// The tensors `env` announces, checked against the payload's size.
std::vector<TensorLayout> layouts_of(wire::Envelope::Reader env, uint64_t payload_bytes) {
  auto metas = env.getTensors();
  std::vector<TensorLayout> out;
  out.reserve(metas.size());
  uint64_t total = 0;
  for (auto meta : metas) {
    GW_CHECK(meta.getDtype() <= static_cast<uint8_t>(DType::Float64), IoError,
             "[rpc] unknown dtype code ", int{meta.getDtype()});
    TensorLayout l{
        static_cast<DType>(meta.getDtype()), {}, 0, meta.getRequiresGrad(), meta.hasShared()};
    // `extent`, the product of max(size, 1), is the largest contiguous stride: it must fit in
    // int64 even when a zero size makes the tensor empty (and numel small).
    constexpr uint64_t kMaxExtent = uint64_t{1} << 62;
    uint64_t numel = 1, extent = 1;
    for (int64_t s : meta.getSizes()) {
      const uint64_t at_least_one = s > 0 ? static_cast<uint64_t>(s) : 1;
      GW_CHECK(s >= 0 && extent <= kMaxExtent / at_least_one, IoError, "[rpc] tensor size ", s,
               " is negative or too large");
      extent *= at_least_one;
      numel *= static_cast<uint64_t>(s);
      l.sizes.push_back(s);
    }
    GW_CHECK(meta.getDevice() >= 0 || !l.shared, IoError,
             "[rpc] a tensor shared by IPC handle must go to a CUDA device");
    if (l.shared) {  // its bytes stay in the sender's device memory
      GW_CHECK(numel <= std::numeric_limits<uint64_t>::max() / itemsize(l.dtype), IoError,
               "[rpc] a shared tensor of ", numel, " elements is too large");
      out.push_back(std::move(l));
      continue;
    }
    GW_CHECK(numel <= (payload_bytes - total) / itemsize(l.dtype), IoError,
             "[rpc] tensors need more bytes than the payload's ", payload_bytes);
    l.nbytes = numel * itemsize(l.dtype);
    total += l.nbytes;
    out.push_back(std::move(l));
  }
  GW_CHECK(total == payload_bytes, IoError, "[rpc] tensors take ", total,
           " bytes but the payload has ", payload_bytes);
  return out;
}

// The message of `env`, whose payload has been read into `tensors` (one per layout).
Message message_of(wire::Envelope::Reader env, std::vector<Tensor> tensors) {
  Message m;
  m.id = env.getId();
  auto body = env.getBody();
  auto values = [&](capnp::List<wire::Value>::Reader in) {
    IValueList out;
    out.reserve(in.size());
    for (auto v : in) out.push_back(read_value(v, tensors, 0));
    return out;
  };
  using B = wire::Envelope::Body;
  switch (body.which()) {
    case B::HANDSHAKE: {
      auto h = body.getHandshake();
      Handshake out{h.getProtocolVersion(), text(h.getWorkerName()), h.getWorkerId(), {}};
      for (auto p : h.getDeviceMap()) m.device_map.emplace_back(p.getFrom(), p.getTo());
      if (h.hasShm()) {
        auto in = h.getShm();
        GW_CHECK(in.getStep() <= static_cast<uint8_t>(SharedMemory::Step::kSwitch), IoError,
                 "[rpc] a Handshake with shared-memory step ", int{in.getStep()});
        auto token = in.getToken();
        out.shm = SharedMemory{static_cast<SharedMemory::Step>(in.getStep()),
                               text(in.getHost()),
                               in.getPid(),
                               in.getFd(),
                               in.getRingBytes(),
                               std::string(token.begin(), token.end())};
      }
      for (uint64_t lease : h.getCudaIpcReleased()) out.cuda_ipc_released.push_back(lease);
      m.body = std::move(out);
      break;
    }
    case B::RESPONSE: {
      auto r = body.getResponse();
      Response out;
      if (r.isError()) {
        auto e = r.getError();
        out.error = Failure{text(e.getWorker()), text(e.getMessage()),
                            e.getCode() <= static_cast<uint16_t>(ErrorCode::kInternal)
                                ? static_cast<ErrorCode>(e.getCode())
                                : ErrorCode::kRemote};
      } else {
        out.value = read_value(r.getValue(), tensors, 0);
      }
      m.body = std::move(out);
      break;
    }
    case B::CALL:
      m.body = Request(Call{text(body.getCall().getFunction()), values(body.getCall().getArgs())});
      break;
    case B::RREF_CREATE: {
      auto c = body.getRrefCreate();
      m.body = Request(RRefCreate{id_of(c.getRrefId()), id_of(c.getForkId()), text(c.getFunction()),
                                  values(c.getArgs())});
      break;
    }
    case B::RREF_FETCH:
      m.body = Request(RRefFetch{id_of(body.getRrefFetch())});
      break;
    case B::RREF_FORK:
      m.body = Request(
          RRefFork{id_of(body.getRrefFork().getRrefId()), id_of(body.getRrefFork().getForkId())});
      break;
    case B::RREF_ACCEPT:
      m.body = Request(RRefAccept{id_of(body.getRrefAccept())});
      break;
    case B::RREF_DELETE:
      m.body = Request(RRefDelete{id_of(body.getRrefDelete().getRrefId()),
                                  id_of(body.getRrefDelete().getForkId())});
      break;
    case B::AUTOGRAD_GRADIENTS: {
      auto g = body.getAutogradGradients();
      AutogradGradients out{
          g.getContextId(), g.getMessageId(), g.getPassId(), g.getRetainGraph(), {},
          g.getReturned(),  g.getSmart()};
      out.grads.reserve(g.getGrads().size());
      for (auto v : g.getGrads()) {
        GW_CHECK(v.isTensor() || v.isNone(), IoError,
                 "[rpc] a gradient must be a tensor or none, got value kind ",
                 static_cast<int>(v.which()));
        out.grads.push_back(v.isTensor() ? read_value(v, tensors, 0).to_tensor() : Tensor());
      }
      m.body = Request(std::move(out));
      break;
    }
    case B::AUTOGRAD_DISCOVER: {
      auto d = body.getAutogradDiscover();
      AutogradDiscover out{d.getContextId(), d.getPassId(), d.getRetainGraph(), {}, d.getClosed()};
      for (uint64_t id : d.getMessageIds()) out.message_ids.push_back(id);
      m.body = Request(std::move(out));
      break;
    }
    case B::AUTOGRAD_RELEASE: {
      AutogradRelease out;
      for (uint64_t id : body.getAutogradRelease()) out.context_ids.push_back(id);
      m.body = Request(std::move(out));
      break;
    }
    case B::AUTOGRAD_BACKWARD: {
      auto b = body.getAutogradBackward();
      m.body = Request(AutogradBackward{IValue::rref_fork(read_fork(b.getRref())), b.getContextId(),
                                        b.getRetainGraph()});
      break;
    }
    default:
      throw IoError(gw::detail::str("[rpc] unknown message kind ", static_cast<int>(body.which())));
  }
  if (env.hasAutograd()) {
    auto a = env.getAutograd();
    m.autograd = AutogradInfo{a.getContextId(), a.getMessageId()};
  }
  auto metas = env.getTensors();
  for (unsigned i = 0; i < metas.size() && i < tensors.size(); ++i) {
    const int device = metas[i].getDevice();
    GW_CHECK(device >= -1, IoError, "[rpc] bad device index ", device, " for tensor ", i);
    if (device < 0) continue;
    Message::Placement& p = m.placements.emplace_back(Message::Placement{tensors[i], device});
    if (!metas[i].hasShared()) continue;
    auto in = metas[i].getShared();
    SharedCudaTensor& s = p.shared.emplace();
    auto memory = in.getMemory();
    GW_CHECK(memory.size() == s.memory.size(), IoError, "[rpc] shared tensor ", i,
             " has a memory handle of ", memory.size(), " bytes, not ", s.memory.size());
    std::copy(memory.begin(), memory.end(), s.memory.begin());
    s.offset = in.getOffset();
    for (int64_t size : metas[i].getSizes()) p.sizes.push_back(size);
  }
  m.cuda_ipc_lease = env.getCudaIpcLease();
  GW_CHECK(
      m.cuda_ipc_lease != 0 ||
          std::ranges::none_of(m.placements, [](const auto& p) { return p.shared.has_value(); }),
      IoError, "[rpc] tensors shared by IPC handle without a lease to return");
  return m;
}
}  // namespace

// A function-try-block: Cap'n Proto may reject the segment table in reader_'s constructor.
FrameHeader::FrameHeader(kj::ArrayPtr<const capnp::word> words, uint64_t payload_bytes) try
    : reader_(words, reader_options(words.size())),
      layouts_(layouts_of(reader_.getRoot<wire::Envelope>(), payload_bytes)) {
} catch (const kj::Exception& e) {
  throw malformed(e);
}

Message FrameHeader::decode(std::vector<Tensor> tensors) {
  return guard_capnp(
      [&] { return message_of(reader_.getRoot<wire::Envelope>(), std::move(tensors)); });
}

std::vector<TensorLayout> tensor_layouts(kj::ArrayPtr<const capnp::word> header,
                                         uint64_t payload_bytes) {
  return FrameHeader(header, payload_bytes).tensors();
}

Message decode(kj::ArrayPtr<const capnp::word> header, std::vector<Tensor> tensors) {
  return guard_capnp([&] {
    capnp::FlatArrayMessageReader reader(header, reader_options(header.size()));
    return message_of(reader.getRoot<wire::Envelope>(), std::move(tensors));
  });
}

void place_on_devices(Message& m) {
  trace::Scope span("rpc", "place on devices");
  auto place = [&] {
    for (Message::Placement& p : m.placements)
      p.tensor.set_data(p.shared ? import_cuda_tensor(*p.shared, p.tensor.dtype(), p.sizes,
                                                      p.device, m.cuda_ipc_receipt->sender())
                                 : p.tensor.detach().to(cuda_device(p.device)));
  };
  if (m.cuda_ipc_receipt)
    m.cuda_ipc_receipt->while_open(place);
  else
    place();
  m.placements.clear();
  m.cuda_ipc_receipt.reset();  // the copies are done: the sender may have its memory back
}

}  // namespace gw::rpc
