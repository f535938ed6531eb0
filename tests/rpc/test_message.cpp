// The frame codec: what encode writes, the validation of what a peer sends.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "core/ops.h"
#include "rpc/frame_reader.h"
#include "rpc/message.h"
#include "rpc/wire.capnp.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

using namespace gw;
using namespace gw::rpc;

namespace {
struct FrameBytes {
  std::vector<uint8_t> prefix, header;
};
FrameBytes frame_bytes(const OutgoingFrame& f) {
  FrameBytes b;
  b.prefix.assign(f.prefix.begin(), f.prefix.end());
  auto* h = reinterpret_cast<const uint8_t*>(f.header.begin());
  b.header.assign(h, h + f.header.size() * 8);
  return b;
}
Message call_message(std::string function, IValueList args, uint64_t id = 0) {
  Message m;
  m.id = id;
  m.body = Request(Call{std::move(function), std::move(args)});
  return m;
}
const Call& call_of(const Message& m) { return std::get<Call>(*m.request()); }
const Response& response_of(const Message& m) {
  REQUIRE(m.get<Response>() != nullptr);
  return *m.get<Response>();
}
kj::Array<capnp::word> words(const std::vector<uint8_t>& bytes) {
  auto w = kj::heapArray<capnp::word>(bytes.size() / 8);
  std::memcpy(w.begin(), bytes.data(), bytes.size());
  return w;
}
}  // namespace

TEST_CASE("a request survives encode and decode", "[message]") {
  Tensor a = arange(0, 6).reshape({2, 3}).to(kFloat32), b = ones({3}, kInt64);
  Message m =
      call_message("my_add",
                   {IValue(a), IValue(IValueList{IValue(b), IValue(int64_t{3}), IValue(2.5)}),
                    IValue(std::string("s")), IValue(), IValue::bytes({1, 2, 3})},
                   99);
  OutgoingFrame f = encode(m);
  REQUIRE(f.tensors.size() == 2);
  FrameBytes bytes = frame_bytes(f);
  FramePrefix p = parse_prefix(bytes.prefix.data(), 1 << 20);
  CHECK(p.header_bytes == bytes.header.size());
  CHECK(p.payload_bytes == a.nbytes() + b.nbytes());
  auto header = words(bytes.header);
  auto layouts = tensor_layouts(header.asPtr(), p.payload_bytes);
  REQUIRE(layouts.size() == 2);
  CHECK(layouts[0].sizes == Shape{2, 3});
  CHECK(layouts[1].dtype == kInt64);
  // The payload a peer would read: copies of what encode queued, in its order.
  Message d = decode(header.asPtr(), {f.tensors[0].clone(), f.tensors[1].clone()});
  CHECK(d.id == 99);
  REQUIRE(d.request() != nullptr);
  const Call& c = call_of(d);
  CHECK(c.function == "my_add");
  REQUIRE(c.args.size() == 5);
  CHECK(gw::equal(c.args[0].to_tensor(), a));
  CHECK(c.args[1].to_list()[1].to_int() == 3);
  CHECK(c.args[1].to_list()[2].to_double() == 2.5);
  CHECK(c.args[2].to_string() == "s");
  CHECK(c.args[3].is(IValue::Kind::kNone));
  CHECK(c.args[4].to_bytes() == rpc::Bytes{1, 2, 3});
}

TEST_CASE("a failure response carries the worker and message", "[message]") {
  Message m;
  m.body = Response{IValue(), Failure{"worker1", "boom", ErrorCode::kIndex}};
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  Message d = decode(header.asPtr(), {});
  const Response& r = response_of(d);
  REQUIRE(r.error);
  CHECK(r.error->worker == "worker1");
  CHECK(r.error->message == "boom");
  CHECK(r.error->code == ErrorCode::kIndex);
}

TEST_CASE("malformed prefixes are rejected before anything is allocated", "[message]") {
  Message m = call_message("f", {IValue(ones({1024}))});
  FrameBytes good = frame_bytes(encode(m));
  auto bad = good.prefix;
  bad[0] ^= 0xff;
  CHECK_THROWS_WITH(parse_prefix(bad.data(), 1 << 20), Catch::Contains("bad frame magic"));
  bad = good.prefix;
  bad[4] = 3;  // header size not a multiple of 8
  CHECK_THROWS_WITH(parse_prefix(bad.data(), 1 << 20), Catch::Contains("bad header size"));
  CHECK_THROWS_WITH(parse_prefix(good.prefix.data(), 1024),
                    Catch::Contains("exceeds the maximum frame size 1024"));
}

TEST_CASE("headers that lie about their tensors are rejected", "[message]") {
  Message m = call_message("f", {IValue(ones({4, 4}))});
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  CHECK_THROWS_WITH(tensor_layouts(header.asPtr(), 10), Catch::Contains("payload"));
  CHECK_THROWS_WITH(tensor_layouts(header.asPtr(), 1000), Catch::Contains("payload has 1000"));
  CHECK_NOTHROW(tensor_layouts(header.asPtr(), 64));
  // Garbage in place of the Cap'n Proto header.
  std::vector<uint8_t> junk(64, 0xab);
  auto junk_words = words(junk);
  CHECK_THROWS_AS(tensor_layouts(junk_words.asPtr(), 0), IoError);
  CHECK_THROWS_AS(decode(junk_words.asPtr(), {}), IoError);
  // A value pointing at a tensor that is not there.
  CHECK_THROWS_WITH(decode(header.asPtr(), {}), Catch::Contains("refers to tensor 0 of 0"));
}

TEST_CASE("tensors that cannot be sent are refused on the sender", "[message]") {
  Message m = call_message("f", {IValue(Tensor())});
  CHECK_THROWS_WITH(encode(m), Catch::Contains("undefined tensor"));
}

TEST_CASE("empty tensors and strings with NUL bytes survive the codec", "[message]") {
  Message m =
      call_message(std::string("f\0g", 3), {IValue(empty({7, 0})), IValue(std::string("a\0b", 3))});
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  FramePrefix p = parse_prefix(bytes.prefix.data(), 1 << 20);
  auto layouts = tensor_layouts(header.asPtr(), p.payload_bytes);  // found by the fuzzer
  REQUIRE(layouts.size() == 1);
  CHECK(layouts[0].sizes == Shape{7, 0});
  Message d = decode(header.asPtr(), {empty({7, 0})});
  CHECK(call_of(d).function == std::string("f\0g", 3));
  CHECK(call_of(d).args[1].to_string() == std::string("a\0b", 3));
}

TEST_CASE("a zero size does not let huge sizes through", "[message]") {
  // Sizes (0, 2^40, 2^40): no bytes, but contiguous strides would overflow int64.
  Message m = call_message("f", {IValue(empty({0, 4}))});
  OutgoingFrame f = encode(m);
  capnp::FlatArrayMessageReader reader(f.header.asPtr());
  capnp::MallocMessageBuilder b;
  b.setRoot(reader.getRoot<rpc::wire::Envelope>());
  auto sizes = b.getRoot<rpc::wire::Envelope>().getTensors()[0].initSizes(3);
  sizes.set(0, 0);
  sizes.set(1, int64_t{1} << 40);
  sizes.set(2, int64_t{1} << 40);
  auto header = capnp::messageToFlatArray(b);
  CHECK_THROWS_WITH(tensor_layouts(header.asPtr(), 0), Catch::Contains("too large"));
}

namespace {
std::vector<uint8_t> stream_of(const std::vector<Message>& messages) {
  std::vector<uint8_t> out;
  for (const auto& m : messages) {
    OutgoingFrame f = encode(m);
    FrameBytes b = frame_bytes(f);
    out.insert(out.end(), b.prefix.begin(), b.prefix.end());
    out.insert(out.end(), b.header.begin(), b.header.end());
    for (const Tensor& t : f.tensors) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      out.insert(out.end(), p, p + t.nbytes());
    }
  }
  return out;
}
}  // namespace

TEST_CASE("FrameReader reads a stream cut into reads of any size", "[message]") {
  Tensor big = arange(0, 5000).to(kFloat32), empty_one = zeros({0, 3}), small = ones({2}, kInt64);
  Message call = call_message("my_add", {IValue(big), IValue(empty_one), IValue(small)}, 7);
  Message answer;
  answer.id = 7;
  answer.body = Response{IValue(int64_t{42}), std::nullopt};
  const std::vector<uint8_t> bytes = stream_of({call, answer, call});
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, bytes.size()}) {
    INFO("reads of " << chunk << " bytes");
    FrameReader reader(1 << 20);
    std::vector<Message> got;
    for (size_t at = 0; at < bytes.size(); at += chunk) {
      const uint8_t* data = bytes.data() + at;
      size_t n = std::min(chunk, bytes.size() - at);
      while (n > 0) {
        const size_t used = reader.feed(data, n);
        data += used, n -= used;
        if (auto m = reader.take()) got.push_back(std::move(*m));
      }
    }
    CHECK(reader.between_frames());
    REQUIRE(got.size() == 3);
    CHECK(call_of(got[0]).function == "my_add");
    CHECK(gw::equal(call_of(got[0]).args[0].to_tensor(), big));
    CHECK(call_of(got[0]).args[1].to_tensor().sizes() == Shape{0, 3});
    CHECK(gw::equal(call_of(got[2]).args[2].to_tensor(), small));
    CHECK(response_of(got[1]).value.to_int() == 42);
  }
}

TEST_CASE("FrameReader drops heartbeats between frames", "[message]") {
  Message call = call_message("f", {IValue(int64_t{7})}, 5);
  const OutgoingFrame beat = heartbeat_frame();
  REQUIRE(beat.total_bytes() == kFramePrefixBytes);
  std::vector<uint8_t> bytes(beat.prefix.begin(), beat.prefix.end());
  const std::vector<uint8_t> frame = stream_of({call});
  bytes.insert(bytes.end(), frame.begin(), frame.end());
  bytes.insert(bytes.end(), beat.prefix.begin(), beat.prefix.end());
  FrameReader reader(1 << 20);
  std::vector<Message> got;
  for (size_t at = 0; at < bytes.size();) {  // a byte at a time: every split point
    at += reader.feed(bytes.data() + at, 1);
    if (auto m = reader.take()) got.push_back(std::move(*m));
  }
  REQUIRE(got.size() == 1);
  CHECK(got[0].id == 5);
  CHECK(reader.between_frames());
  // A prefix with a payload but no header is still refused.
  std::vector<uint8_t> bad(beat.prefix.begin(), beat.prefix.end());
  bad[8] = 8;
  FrameReader strict(1 << 20);
  CHECK_THROWS_AS(strict.feed(bad.data(), bad.size()), IoError);
}

TEST_CASE("FrameReader hands a large tensor's bytes to a direct read", "[message]") {
  Tensor big = arange(0, 4096).to(kFloat32);
  Message call = call_message("f", {IValue(big)}, 3);
  const std::vector<uint8_t> bytes = stream_of({call});
  FrameReader reader(1 << 20);
  const size_t head = bytes.size() - big.nbytes();  // prefix + header
  REQUIRE(reader.feed(bytes.data(), head) == head);
  CHECK_FALSE(reader.take());
  CHECK(reader.direct_target(big.nbytes() + 1).empty());  // fewer bytes than asked are due
  std::span<uint8_t> target = reader.direct_target(1024);
  REQUIRE(target.size() == big.nbytes());
  // What socket reads do: a first part, then the rest.
  const size_t part = 1000;
  std::memcpy(target.data(), bytes.data() + head, part);
  reader.direct_filled(part);
  CHECK_FALSE(reader.take());
  target = reader.direct_target(1024);
  REQUIRE(target.size() == big.nbytes() - part);
  CHECK_THROWS_AS(reader.direct_filled(target.size() + 1), InvalidArgumentError);
  std::memcpy(target.data(), bytes.data() + head + part, target.size());
  reader.direct_filled(target.size());
  auto m = reader.take();
  REQUIRE(m);
  CHECK(gw::equal(call_of(*m).args[0].to_tensor(), big));
  CHECK(reader.between_frames());
}

TEST_CASE("FrameReader refuses a bad prefix before reading further", "[message]") {
  FrameReader reader(1 << 20);
  std::vector<uint8_t> junk(kFramePrefixBytes, 0xAB);
  CHECK_THROWS_WITH(reader.feed(junk.data(), junk.size()), Catch::Contains("bad frame magic"));
}

TEST_CASE("every system message crosses the wire as its own typed variant", "[message]") {
  const std::vector<Request> all{
      RRefCreate{{1, 2}, {1, 3}, "make", {IValue(ones({2}))}},
      RRefFetch{{4, 5}},
      RRefFork{{1, 2}, {6, 7}},
      RRefAccept{{6, 7}},
      RRefDelete{{1, 2}, {6, 8}},
      AutogradGradients{11, 12, 13, true, {full({2}, 3.0), Tensor()}, true, true},
      AutogradRelease{{uint64_t{1} << 60, 2, 3}},
      AutogradBackward{IValue::rref_fork(RRefForkData{1, {1, 2}, {3, 4}, 0}), 9, true},
      AutogradDiscover{14, 15, true, {16, uint64_t{1} << 62}, true}};
  for (const Request& r : all) {
    INFO(describe(r));
    Message m;
    m.id = 5;
    m.body = r;
    const std::vector<uint8_t> bytes = stream_of({m});
    FrameReader reader(1 << 20);
    REQUIRE(reader.feed(bytes.data(), bytes.size()) == bytes.size());
    auto d = reader.take();
    REQUIRE(d);
    CHECK(d->id == 5);
    REQUIRE(d->request() != nullptr);
    CHECK(d->request()->index() == r.index());
    CHECK(describe(*d->request()) == describe(r));
  }
  auto round_trip = [](const Request& r) {
    Message m;
    m.body = r;
    const std::vector<uint8_t> bytes = stream_of({m});
    FrameReader reader(1 << 20);
    reader.feed(bytes.data(), bytes.size());
    return std::move(*reader.take()->request());
  };
  auto create = std::get<RRefCreate>(round_trip(all[0]));
  CHECK(create.rref_id == RRefId{1, 2});
  CHECK(create.fork_id == ForkId{1, 3});
  CHECK(create.function == "make");
  CHECK(gw::equal(create.args[0].to_tensor(), ones({2})));
  CHECK(std::get<RRefDelete>(round_trip(all[4])).fork_id == ForkId{6, 8});
  auto grads = std::get<AutogradGradients>(round_trip(all[5]));
  CHECK((grads.context_id == 11 && grads.message_id == 12 && grads.pass_id == 13));
  CHECK((grads.retain_graph && grads.returned && grads.smart));
  REQUIRE(grads.grads.size() == 2);
  CHECK(gw::equal(grads.grads[0], full({2}, 3.0)));
  CHECK_FALSE(grads.grads[1].defined());
  CHECK(std::get<AutogradRelease>(round_trip(all[6])).context_ids ==
        std::vector<uint64_t>{uint64_t{1} << 60, 2, 3});
  auto backward = std::get<AutogradBackward>(round_trip(all[7]));
  CHECK(backward.rref.to_rref_fork().fork_id == ForkId{3, 4});
  CHECK((backward.context_id == 9 && backward.retain_graph));
  auto discover = std::get<AutogradDiscover>(round_trip(all[8]));
  CHECK((discover.context_id == 14 && discover.pass_id == 15 && discover.retain_graph));
  CHECK(discover.message_ids == std::vector<uint64_t>{16, uint64_t{1} << 62});
  CHECK(discover.closed);
}

TEST_CASE("a tensor shared by IPC handle is checked before anything is opened", "[message]") {
  // What a peer on this host sends for a CUDA tensor: a handle, no payload bytes.
  const auto shared_frame = [](int16_t device, uint64_t lease, unsigned handle_bytes) {
    OutgoingFrame f = encode(call_message("f", {IValue(ones({4}))}));
    capnp::FlatArrayMessageReader reader(f.header.asPtr());
    capnp::MallocMessageBuilder b;
    b.setRoot(reader.getRoot<rpc::wire::Envelope>());
    auto env = b.getRoot<rpc::wire::Envelope>();
    env.setCudaIpcLease(lease);
    auto meta = env.getTensors()[0];
    meta.setDevice(device);
    auto shared = meta.initShared();
    shared.initMemory(handle_bytes)[0] = 7;
    shared.setOffset(512);
    return capnp::messageToFlatArray(b);
  };
  auto good = shared_frame(0, 9, 64);
  auto layouts = tensor_layouts(good.asPtr(), 0);  // no payload bytes for it
  REQUIRE(layouts.size() == 1);
  CHECK(layouts[0].shared);
  CHECK(layouts[0].nbytes == 0);
  Message m = decode(good.asPtr(), {empty({0})});
  REQUIRE(m.placements.size() == 1);
  REQUIRE(m.placements[0].shared);
  CHECK(m.placements[0].shared->memory[0] == 7);
  CHECK(m.placements[0].shared->offset == 512);
  CHECK(m.placements[0].sizes == Shape{4});
  CHECK(m.cuda_ipc_lease == 9);
  // Bytes would be read into it as if it were sent as bytes: refused.
  CHECK_THROWS_WITH(tensor_layouts(good.asPtr(), 16), Catch::Contains("payload has 16"));
  CHECK_THROWS_WITH(tensor_layouts(shared_frame(-1, 9, 64).asPtr(), 0),
                    Catch::Contains("must go to a CUDA device"));
  CHECK_THROWS_WITH(decode(shared_frame(0, 0, 64).asPtr(), {empty({0})}),
                    Catch::Contains("without a lease"));
  CHECK_THROWS_WITH(decode(shared_frame(0, 9, 10).asPtr(), {empty({0})}),
                    Catch::Contains("memory handle of 10 bytes"));
}

TEST_CASE("a release of CUDA IPC leases survives the codec", "[message]") {
  Handshake h;
  h.cuda_ipc_released = {3, 5};
  Message m;
  m.body = h;
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  Message d = decode(header.asPtr(), {});
  REQUIRE(d.get<Handshake>() != nullptr);
  CHECK(d.get<Handshake>()->cuda_ipc_released == std::vector<uint64_t>{3, 5});
}
