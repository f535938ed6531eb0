// serialize/deserialize and safetensors: round trips of every dtype and geometry, the exact byte
// layouts, and malformed input of every kind producing an IoError that says what is wrong.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/ops.h"
#include "core/safetensors_file.h"
#include "tests/core/test_util.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using gw::Tensor;

namespace {

// The row-major bytes of t (t is copied only when it is not contiguous).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && bytes_of(a) == bytes_of(b);
}


// One small tensor of every dtype.
std::vector<Tensor> one_of_each_dtype() {
  return {
      gw::from_vector<float>({1.5f, -2.f, 3.25f, 0.f, 1e-30f, -7.f}, {2, 3}),
      gw::from_vector<double>({1.0 / 3, -1e300, 2.0}, {3}),
      gw::from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {2, 1, 2}),
      gw::from_vector<int32_t>({INT32_MIN, 5, INT32_MAX}, {3, 1}),
      gw::from_vector<bool>({true, false, false, true}, {4}),
      core_test::from_bits({0x3c00, 0xc000, 0x7bff, 0x0001}, gw::kFloat16, {2, 2}),
      core_test::from_bits({0x3f80, 0xc040, 0x7f80, 0x0001}, gw::kBFloat16, {2, 2}),
  };
}

// Non-contiguous views and edge geometries (computable dtypes only: views need a CPU copy).
std::vector<Tensor> odd_geometries() {
  Tensor m = gw::arange(24.0).reshape({2, 3, 4});
  return {
      m.transpose(0, 2),      m.slice(2, 1, 4, 2),
      m.select(1, 1),         gw::tensor<int64_t>({7, 8, 9}).unsqueeze(0).expand({4, 3}),
      gw::scalar_tensor(2.5), gw::scalar_tensor(int64_t{-3}),
      gw::zeros({0}),         gw::zeros({2, 0, 3}, gw::kInt32),
  };
}

// The message of the IoError f throws ("no IoError" otherwise).
template <typename F>
std::string io_error(F&& f) {
  try {
    f();
  } catch (const gw::IoError& e) {
    return e.what();
  }
  return "no IoError";
}

std::vector<uint8_t> le64(uint64_t v) {
  std::vector<uint8_t> b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}

// A safetensors buffer with the given header text and `data` zero bytes after it.
std::vector<uint8_t> st_file(const std::string& header, size_t data = 0) {
  std::vector<uint8_t> out = le64(header.size());
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data, 0);
  return out;
}

std::string st_error(const std::string& header, size_t data = 0) {
  auto bytes = st_file(header, data);
  return io_error([&] { gw::from_safetensors(bytes); });
}

// The IoError for a header with a JSON syntax error: nlohmann's own message after the usual
// prefix (checked here), so that callers check only the words that name the error.
std::string st_syntax_error(const std::string& header, size_t data = 0) {
  std::string m = st_error(header, data);
  CHECK_THAT(m, StartsWith("[from_safetensors] ") && Contains("syntax error"));
  return m;
}

std::string temp_path(const char* tag) {
  static std::mt19937_64 rng(std::random_device{}());
  auto name = "gw_test_" + std::string(tag) + "_" + std::to_string(rng()) + ".safetensors";
  return (std::filesystem::temp_directory_path() / name).string();
}

}  // namespace

// --- serialize / deserialize -----------------------------------------------------------------

TEST_CASE("serialize: round trip of every dtype", "[core][serialize]") {
  for (const Tensor& t : one_of_each_dtype()) {
    INFO("dtype " << t.dtype());
    Tensor back = gw::deserialize(gw::serialize(t));
    CHECK(same(back, t));
    CHECK(back.is_contiguous());
  }
}

TEST_CASE("serialize: views, 0-dim and empty tensors", "[core][serialize]") {
  for (const Tensor& t : odd_geometries()) {
    INFO("shape " << gw::shape_str(t.sizes()) << " strides " << gw::shape_str(t.strides()));
    Tensor back = gw::deserialize(gw::serialize(t));
    CHECK(same(back, t));
    CHECK(back.storage() != t.storage());
  }
}

TEST_CASE("serialize: byte layout", "[core][serialize]") {
  auto bytes = gw::serialize(gw::from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {3, 2}).t());
  std::vector<uint8_t> expected = {'G', 'W', 'T', '1', uint8_t(gw::kInt32), 2};
  for (uint64_t s : {2, 3}) {
    auto b = le64(s);
    expected.insert(expected.end(), b.begin(), b.end());
  }
  for (int32_t v : {1, 3, 5, -2, 4, 6}) {  // row-major order of the transposed view
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    expected.insert(expected.end(), b, b + 4);
  }
  CHECK(bytes == expected);
}

TEST_CASE("deserialize: malformed input throws IoError", "[core][serialize]") {
  auto good = gw::serialize(gw::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  auto with = [&](size_t at, uint8_t value) {
    auto b = good;
    b[at] = value;
    return b;
  };
  auto err = [](std::vector<uint8_t> b) { return io_error([&] { gw::deserialize(b); }); };

  CHECK_THAT(err({}), Contains("[deserialize] truncated header: got 0 bytes"));
  CHECK_THAT(err({'G', 'W', 'T'}), Contains("truncated"));
  CHECK_THAT(err(with(0, 'X')), Contains("bad magic 0x58575431"));
  CHECK_THAT(err(with(4, 7)), Contains("unknown dtype value 7"));
  CHECK_THAT(err(with(4, 255)), Contains("unknown dtype value 255"));
  CHECK_THAT(err(with(5, 65)), Contains("ndim 65 exceeds the maximum of 64"));
  CHECK_THAT(err(with(5, 40)), Contains("truncated header: ndim 40 needs 326 bytes"));
  CHECK_THAT(err(std::vector<uint8_t>(good.begin(), good.begin() + 10)), Contains("truncated"));
  CHECK_THAT(err(with(13, 0x80)), Contains("negative size"));  // top byte of dim 0
  {
    auto b = good;  // 2^40 x 2^40 elements: the byte count leaves int64
    std::memcpy(b.data() + 6, le64(uint64_t{1} << 40).data(), 8);
    std::memcpy(b.data() + 14, le64(uint64_t{1} << 40).data(), 8);
    CHECK_THAT(err(b), Contains("overflows"));
  }
  auto longer = good;
  longer.push_back(0);
  CHECK_THAT(err(longer), Contains("needs 24 data bytes, got 25"));
  CHECK_THAT(err(std::vector<uint8_t>(good.begin(), good.end() - 1)),
             Contains("needs 24 data bytes, got 23"));
  CHECK_THAT(err(with(6, 3)), Contains("shape (3,3) of float32 needs 36 data bytes, got 24"));
  CHECK(gw::deserialize(good).sizes() == gw::Shape{2, 3});
  // A bool is byte 0 or 1: any other reads as true and as not true.
  auto bools = gw::serialize(gw::from_vector<bool>({true, false, true}));
  bools[bools.size() - 2] = 2;
  CHECK_THAT(err(bools), Contains("[deserialize] the tensor: bool element 1 is byte 2"));
}

// --- safetensors -----------------------------------------------------------------------------

TEST_CASE("safetensors: round trip of every dtype and geometry", "[core][serialize]") {
  gw::NamedTensors in;
  int k = 0;
  for (const Tensor& t : one_of_each_dtype()) in["t" + std::to_string(k++)] = t;
  for (const Tensor& t : odd_geometries()) in["v" + std::to_string(k++)] = t;
  auto bytes = gw::to_safetensors(in);
  std::vector<uint8_t> copy = bytes;
  gw::NamedTensors out = gw::from_safetensors(copy);
  std::fill(copy.begin(), copy.end(), 0xff);  // loaded tensors own their memory
  REQUIRE(out.size() == in.size());
  for (const auto& [name, t] : in) {
    INFO(name);
    REQUIRE(out.count(name) == 1);
    CHECK(same(out.at(name), t));
    CHECK(out.at(name).storage()->nbytes() >= t.nbytes());
  }
}

TEST_CASE("safetensors: layout follows the reference writer", "[core][serialize]") {
  gw::NamedTensors in = {{"b", gw::from_vector<int64_t>({7}, {1, 1})},
                         {"a", gw::from_vector<float>({1.f, 2.f})}};
  auto bytes = gw::to_safetensors(in);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  std::string header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}})";
  CHECK(header == json + std::string(n - json.size(), ' '));
  REQUIRE(bytes.size() == 8 + n + 16);
  float a1;
  std::memcpy(&a1, bytes.data() + 8 + n + 4, 4);
  CHECK(a1 == 2.f);
  CHECK(gw::to_safetensors({}).size() == 16);  // "{}" padded to 8 bytes
}

TEST_CASE("safetensors: metadata and names with escapes", "[core][serialize]") {
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"quote\"back\\slash", "tab\tnewline\n\x01"}, {"caf\xc3\xa9", ""}};
  gw::NamedTensors in = {{"w.\"odd\"\n", gw::ones({2})}};
  std::map<std::string, std::string> got;
  auto out = gw::from_safetensors(gw::to_safetensors(in, meta), &got);
  CHECK(got == meta);
  CHECK(out.count("w.\"odd\"\n") == 1);

  // \u escapes, surrogate pairs and all the short escapes decode.
  std::string h = R"({"__metadata__":{"k":"caf\u00e9 \ud83d\ude00 \/\b\f\r"},)"
                  R"("n\u0041me":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}})";
  got.clear();
  out = gw::from_safetensors(st_file(h, 1), &got);
  CHECK(got.at("k") == "caf\xc3\xa9 \xf0\x9f\x98\x80 /\b\f\r");
  CHECK(out.count("nAme") == 1);
  CHECK(out.at("nAme").dim() == 0);
}

TEST_CASE("safetensors: accepted edge cases", "[core][serialize]") {
  // Out-of-order and adjacent ranges, empty tensors anywhere, whitespace, no metadata.
  std::string h =
      " {\n\t\"b\" : {\"data_offsets\": [0, 4], \"dtype\": \"I32\", \"shape\": [1]},"
      "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
      "\"e\": {\"dtype\": \"F64\", \"shape\": [0, 3], \"data_offsets\": [2, 2]}} ";
  std::map<std::string, std::string> meta = {{"stale", "value"}};
  auto out = gw::from_safetensors(st_file(h, 8), &meta);
  CHECK(out.size() == 3);
  CHECK(meta.empty());
  CHECK(out.at("e").sizes() == gw::Shape{0, 3});
  CHECK(gw::from_safetensors(st_file("{}")).empty());
}

TEST_CASE("safetensors: malformed input throws IoError", "[core][serialize]") {
  const std::string f32 = R"("dtype":"F32","shape":[2],)";
  auto one = [&](const std::string& offsets) {
    return "{\"a\":{" + f32 + "\"data_offsets\":" + offsets + "}}";
  };
  CHECK_THAT(st_error(one("[0,8]"), 8), Contains("no IoError"));  // the well-formed baseline

  auto short_file = std::vector<uint8_t>{1, 0, 0};
  CHECK_THAT(io_error([&] { gw::from_safetensors(short_file); }),
             Contains("[from_safetensors] 3 bytes is too short"));
  auto lying = st_file(one("[0,8]"), 8);
  lying[0] += 9;  // header length runs past the end
  CHECK_THAT(io_error([&] { gw::from_safetensors(lying); }), Contains("exceeds the"));
  auto huge = st_file("{}");
  huge[7] = 0x80;
  CHECK_THAT(io_error([&] { gw::from_safetensors(huge); }), Contains("header length"));

  // The header must start with '{' (no byte-order mark).
  CHECK_THAT(st_error(""), Contains("expected '{' but the header ended"));
  CHECK_THAT(st_error("[]"), Contains("expected '{', found '['"));
  CHECK_THAT(st_error("\xef\xbb\xbf{}"), Contains("expected '{', found byte 0xef (header byte 0)"));

  // JSON syntax: nlohmann's words (st_syntax_error checks the prefix and "syntax error").
  CHECK_THAT(st_syntax_error(one("[0,8]") + "x", 8), Contains("expected end of input"));
  CHECK_THAT(st_syntax_error(R"({"a":{)" + f32 + R"("data_offsets":[0,8]},})", 8),
             Contains("expected string literal"));
  CHECK_THAT(st_syntax_error(R"({"a)"),
             Contains("missing closing quote") && Contains("(header byte 3)"));
  CHECK_THAT(st_syntax_error("{\"a\x01\":{}}"), Contains("control character U+0001"));
  CHECK_THAT(st_syntax_error(R"({"a\x":{}})"), Contains("after backslash"));
  CHECK_THAT(st_syntax_error(R"({"a\u12":{}})"), Contains("4 hex digits"));
  CHECK_THAT(st_syntax_error(R"({"\udc00":{}})"), Contains("surrogate U+DC00"));
  CHECK_THAT(st_syntax_error(R"({"\ud800x":{}})"), Contains("surrogate U+D800"));
  CHECK_THAT(st_syntax_error(one("[0,8.]"), 8), Contains("invalid number"));
  CHECK_THAT(st_syntax_error(one("[00,8]"), 8), Contains("number literal"));  // leading zero
  CHECK_THAT(st_error("{\"\xff\":{}}"), Contains("not valid UTF-8"));
  CHECK_THAT(st_error("{\"\xc0\x80\":{}}"), Contains("not valid UTF-8"));  // overlong NUL
  CHECK_THAT(st_error(one("[0,8.0]"), 8), Contains("only integers are allowed"));
  CHECK_THAT(st_error(one("[0,8e0]"), 8), Contains("only integers are allowed"));
  CHECK_THAT(st_error(one("[-0,8]"), 8), Contains("negative numbers are not allowed"));
  CHECK_THAT(st_error(one("[0,99999999999999999999]"), 8), Contains("overflows 64 bits"));
  CHECK_THAT(st_error(one("[0,true]"), 8), Contains("expected a non-negative integer"));
  CHECK_THAT(st_error(one("null"), 8), Contains("expected '['"));
  CHECK_THAT(st_error(R"({"__metadata__":{"k":1}})"), Contains("expected '\"'"));
  CHECK_THAT(st_error(R"({"__metadata__":{"k":"v","k":"w"}})"),
             Contains("duplicate __metadata__ key"));
  CHECK_THAT(st_error(R"({"__metadata__":{},"__metadata__":{}})"),
             Contains("duplicate \"__metadata__\""));

  // Tensor entries.
  CHECK_THAT(st_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2),
             Contains("tensor \"a\" has unsupported dtype \"U8\""));
  CHECK_THAT(st_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8),
             Contains("tensor \"a\" lacks \"dtype\""));
  CHECK_THAT(st_error(R"({"a":{)" + f32 + R"("data_offsets":[0,8],"extra":[1]}})", 8),
             Contains("unknown key \"extra\""));
  CHECK_THAT(st_error(R"({"a":{)" + f32 + R"("dtype":"F32","data_offsets":[0,8]}})", 8),
             Contains("duplicate key \"dtype\""));
  CHECK_THAT(st_error(R"({"a":{)" + f32 +
                          R"("data_offsets":[0,8]},)"
                          R"("a":{)" +
                          f32 + R"("data_offsets":[0,8]}})",
                      8),
             Contains("duplicate tensor name \"a\""));
  CHECK_THAT(st_error(one("[0,4,8]"), 8), Contains("needs 2 data_offsets, got 3"));
  CHECK_THAT(st_error(one("[8,0]"), 8), Contains("data_offsets [8, 0] outside"));
  CHECK_THAT(st_error(one("[0,8]"), 7),
             Contains("data_offsets [0, 8] outside the data section of 7"));
  CHECK_THAT(st_error(one("[0,4]"), 8),
             Contains("tensor \"a\" has 4 data bytes but float32 (2) needs 8"));
  CHECK_THAT(st_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                      R"("data_offsets":[0,0]}})"),
             Contains("overflows the byte count"));
  CHECK_THAT(st_error(R"({"a":{)" + f32 +
                          R"("data_offsets":[0,8]},)"
                          R"("b":{)" +
                          f32 + R"("data_offsets":[4,12]}})",
                      12),
             Contains("tensors \"a\" [0, 8) and \"b\" [4, 12) overlap"));
  CHECK_THAT(st_error(R"({"a":{)" + f32 +
                          R"("data_offsets":[0,8]},)"
                          R"("b":{)" +
                          f32 + R"("data_offsets":[0,8]}})",
                      8),
             Contains("overlap"));
}

TEST_CASE("safetensors: invalid tensors are rejected when writing", "[core][serialize]") {
  CHECK_THROWS_AS(gw::to_safetensors({{"__metadata__", gw::ones({1})}}), gw::InvalidArgumentError);
  CHECK_THROWS_AS(gw::to_safetensors({{"a", Tensor()}}), gw::InvalidArgumentError);
  CHECK_THROWS_AS(gw::to_safetensors({{"\xff", gw::ones({1})}}), gw::InvalidArgumentError);
}

TEST_CASE("safetensors: files", "[core][serialize]") {
  std::string path = temp_path("roundtrip");
  gw::NamedTensors in = {{"w", gw::arange(6.0).reshape({2, 3}).t()},
                         {"i", gw::tensor<int64_t>({1, 2})}};
  gw::save_safetensors(path, in, {{"step", "7"}});
  std::map<std::string, std::string> meta;
  auto out = gw::load_safetensors(path, &meta);
  std::filesystem::remove(path);
  CHECK(meta == std::map<std::string, std::string>{{"step", "7"}});
  REQUIRE(out.size() == 2);
  CHECK(same(out.at("w"), in.at("w")));
  CHECK(same(out.at("i"), in.at("i")));

  std::string missing = temp_path("missing");
  CHECK_THAT(io_error([&] { gw::load_safetensors(missing); }),
             Contains("[load_safetensors] cannot open \"" + missing + "\": No such file"));
  std::string bad_dir = missing + "/nested.safetensors";
  CHECK_THAT(io_error([&] { gw::save_safetensors(bad_dir, in); }),
             Contains("[save_safetensors] cannot open \"" + bad_dir + "\""));

  // Errors while parsing a file name the file.
  std::string junk = temp_path("junk");
  gw::save_safetensors(junk, in);
  std::filesystem::resize_file(junk, std::filesystem::file_size(junk) - 1);
  CHECK_THAT(io_error([&] { gw::load_safetensors(junk); }),
             Contains("[load_safetensors] " + junk + ": tensor"));
  std::ofstream(junk, std::ios::binary) << std::string("\x02\0\0\0\0\0\0\0{x", 10);  // "{x"
  CHECK_THAT(io_error([&] { gw::load_safetensors(junk); }),
             StartsWith("[load_safetensors] " + junk + ": ") && Contains("syntax error"));
  // A bool byte other than 0 or 1, read whole or through SafetensorsFile.
  gw::save_safetensors(junk, {{"mask", gw::from_vector<bool>({true, false, true, false})}});
  {
    std::fstream f(junk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\xfe');
  }
  CHECK_THAT(
      io_error([&] { gw::load_safetensors(junk); }),
      Contains("[load_safetensors] " + junk + ": tensor \"mask\": bool element 3 is byte 254"));
  gw::SafetensorsFile file(junk);
  CHECK_THAT(io_error([&] { file.read("mask"); }),
             Contains("tensor \"mask\": bool element 3 is byte 254"));
  bool first2[2];
  file.read("mask", 0, 2, first2);  // the good part reads
  CHECK((first2[0] && !first2[1]));
  bool last2[2];  // the element is named by its place in the tensor, not in the range read
  CHECK_THAT(io_error([&] { file.read("mask", 2, 2, last2); }),
             Contains("bool element 3 is byte 254"));
  std::filesystem::remove(junk);
}

TEST_CASE("safetensors: the PyTorch-written fixture loads", "[core][serialize]") {
  std::map<std::string, std::string> meta;
  auto t = gw::load_safetensors(GW_SOURCE_DIR "/tests/core/fixtures/reference.safetensors", &meta);
  CHECK(meta.at("generator") == "tests/core/fixtures/make_reference.py");
  CHECK(t.at("in.a").dtype() == gw::kFloat32);
  CHECK(t.at("in.a").sizes() == gw::Shape{2, 3});
  CHECK(t.at("in.cond").dtype() == gw::kBool);
  CHECK(t.at("in.i32").dtype() == gw::kInt32);
  CHECK(t.at("in.s64").dim() == 0);
}

TEST_CASE("serialize: corrupted buffers only ever raise IoError", "[core][serialize]") {
  // Random byte flips, truncations and JSON-ish bytes; anything but an IoError (or a crash
  // under the sanitizers) fails.
  std::mt19937_64 rng(7);
  gw::NamedTensors in = {{"a", gw::arange(6.0).reshape({2, 3})},
                         {"bb", gw::tensor<int64_t>({1, 2})},
                         {"e", gw::zeros({0, 2})}};
  const auto st = gw::to_safetensors(in, {{"k", "v"}});
  const auto ser = gw::serialize(gw::arange(6.0).reshape({2, 3}));
  const std::string json_bytes = "{}[]\":,0123456789-.eu\\ ";
  int other_errors = 0;
  for (int it = 0; it < 4000; ++it) {
    auto b = (it & 1) ? st : ser;
    for (int k = 0, n = 1 + rng() % 4; k < n; ++k) {
      switch (rng() % 4) {
        case 0:
          b[rng() % b.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:
          b.resize(1 + rng() % b.size());
          break;
        case 2:
          b[rng() % std::min<size_t>(b.size(), 8)] = static_cast<uint8_t>(rng());
          break;
        default:
          b[rng() % b.size()] = json_bytes[rng() % json_bytes.size()];
          break;
      }
    }
    try {
      if (it & 1) {
        for (const auto& [name, t] : gw::from_safetensors(b)) (void)t.str();
      } else {
        (void)gw::deserialize(b).str();
      }
    } catch (const gw::IoError&) {
    } catch (const std::exception& e) {
      ++other_errors;
      UNSCOPED_INFO("iteration " << it << ": " << e.what());
    }
  }
  CHECK(other_errors == 0);
}
