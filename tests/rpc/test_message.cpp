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
kj::Array<capnp::word> words(const std::vector<uint8_t>& bytes) {
  auto w = kj::heapArray<capnp::word>(bytes.size() / 8);
  std::memcpy(w.begin(), bytes.data(), bytes.size());
  return w;
}
}  // namespace

TEST_CASE("a request survives encode and decode", "[message]") {
  Message m;
  m.id = 99;
  m.function = "my_add";
  Tensor a = arange(0, 6).reshape({2, 3}).to(kFloat32), b = ones({3}, kInt64);
  m.args = {IValue(a), IValue(IValueList{IValue(b), IValue(int64_t{3}), IValue(2.5)}),
            IValue(std::string("s")), IValue(), IValue::bytes({1, 2, 3})};
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
  CHECK(d.kind == MessageKind::kRequest);
  CHECK(d.function == "my_add");
  REQUIRE(d.args.size() == 5);
  CHECK(gw::equal(d.args[0].to_tensor(), a));
  CHECK(d.args[1].to_list()[1].to_int() == 3);
  CHECK(d.args[1].to_list()[2].to_double() == 2.5);
  CHECK(d.args[2].to_string() == "s");
  CHECK(d.args[3].is(IValue::Kind::kNone));
  CHECK(d.args[4].to_bytes() == rpc::Bytes{1, 2, 3});
}

TEST_CASE("a failure response carries the worker and message", "[message]") {
  Message m;
  m.kind = MessageKind::kResponse;
  m.error = Failure{"worker1", "boom", ErrorCode::kIndex};
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  Message d = decode(header.asPtr(), {});
  REQUIRE(d.error);
  CHECK(d.error->worker == "worker1");
  CHECK(d.error->message == "boom");
  CHECK(d.error->code == ErrorCode::kIndex);
}

TEST_CASE("malformed prefixes are rejected before anything is allocated", "[message]") {
  Message m;
  m.args = {IValue(ones({1024}))};
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
  Message m;
  m.args = {IValue(ones({4, 4}))};
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
  Message m;
  m.args = {IValue(Tensor())};
  CHECK_THROWS_WITH(encode(m), Catch::Contains("undefined tensor"));
}

TEST_CASE("empty tensors and strings with NUL bytes survive the codec", "[message]") {
  Message m;
  m.function = std::string("f\0g", 3);
  m.args = {IValue(empty({7, 0})), IValue(std::string("a\0b", 3))};
  FrameBytes bytes = frame_bytes(encode(m));
  auto header = words(bytes.header);
  FramePrefix p = parse_prefix(bytes.prefix.data(), 1 << 20);
  auto layouts = tensor_layouts(header.asPtr(), p.payload_bytes);  // found by the fuzzer
  REQUIRE(layouts.size() == 1);
  CHECK(layouts[0].sizes == Shape{7, 0});
  Message d = decode(header.asPtr(), {empty({7, 0})});
  CHECK(d.function == std::string("f\0g", 3));
  CHECK(d.args[1].to_string() == std::string("a\0b", 3));
}

TEST_CASE("a zero size does not let huge sizes through", "[message]") {
  // Sizes (0, 2^40, 2^40): no bytes, but contiguous strides would overflow int64.
  Message m;
  m.args = {IValue(empty({0, 4}))};
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
  Message call;
  call.id = 7;
  call.function = "my_add";
  Tensor big = arange(0, 5000).to(kFloat32), empty_one = zeros({0, 3}), small = ones({2}, kInt64);
  call.args = {IValue(big), IValue(empty_one), IValue(small)};
  Message answer;
  answer.kind = MessageKind::kResponse;
  answer.id = 7;
  answer.value = IValue(int64_t{42});
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
    CHECK(got[0].function == "my_add");
    CHECK(gw::equal(got[0].args[0].to_tensor(), big));
    CHECK(got[0].args[1].to_tensor().sizes() == Shape{0, 3});
    CHECK(gw::equal(got[2].args[2].to_tensor(), small));
    CHECK(got[1].kind == MessageKind::kResponse);
    CHECK(got[1].value.to_int() == 42);
  }
}

TEST_CASE("FrameReader hands a large tensor's bytes to a direct read", "[message]") {
  Message call;
  call.id = 3;
  call.function = "f";
  Tensor big = arange(0, 4096).to(kFloat32);
  call.args = {IValue(big)};
  const std::vector<uint8_t> bytes = stream_of({call});
  FrameReader reader(1 << 20);
  const size_t head = bytes.size() - big.nbytes();  // prefix + header
  REQUIRE(reader.feed(bytes.data(), head) == head);
  CHECK_FALSE(reader.take());
  CHECK(reader.direct_target(big.nbytes() + 1).empty());  // fewer bytes than asked are due
  std::span<uint8_t> target = reader.direct_target(1024);
  REQUIRE(target.size() == big.nbytes());
  std::memcpy(target.data(), bytes.data() + head, target.size());  // what a socket read does
  reader.direct_filled();
  auto m = reader.take();
  REQUIRE(m);
  CHECK(gw::equal(m->args[0].to_tensor(), big));
  CHECK(reader.between_frames());
}

TEST_CASE("FrameReader refuses a bad prefix before reading further", "[message]") {
  FrameReader reader(1 << 20);
  std::vector<uint8_t> junk(kFramePrefixBytes, 0xAB);
  CHECK_THROWS_WITH(reader.feed(junk.data(), junk.size()), Catch::Contains("bad frame magic"));
}
