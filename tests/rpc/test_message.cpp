// The frame codec: what encode writes, the validation of what a peer sends.
#include <catch2/catch.hpp>

#include <cstring>

#include "core/ops.h"
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
