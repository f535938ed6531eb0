// save_checkpoint / load_checkpoint: what goes in comes back, and a write that did not finish
// never replaces the checkpoint before it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/checkpoint.h"
#include "core/ops.h"
#include "tests/temp_dir.h"

using namespace gw;

namespace {

Checkpoint sample_checkpoint(float value, int64_t step) {
  Checkpoint c;
  c.model = {{"fc.weight", full({2, 3}, value)}, {"fc.bias", full({2}, value + 1)}};
  c.optimizer = {{"state.0.momentum_buffer", full({2, 3}, -value)},
                 {"lr", full({}, 0.5, kFloat64)}};
  c.epoch = 3;
  c.step = step;
  c.seed = 0xfedcba9876543210;  // above 2^63
  c.extra = {{"note", "a \"quoted\" value"}};
  return c;
}

void check_same(const Checkpoint& a, const Checkpoint& b) {
  REQUIRE(a.model.size() == b.model.size());
  for (const auto& [k, t] : a.model) CHECK(equal(t, b.model.at(k)));
  REQUIRE(a.optimizer.size() == b.optimizer.size());
  for (const auto& [k, t] : a.optimizer) CHECK(equal(t, b.optimizer.at(k)));
  CHECK(a.epoch == b.epoch);
  CHECK(a.step == b.step);
  CHECK(a.seed == b.seed);
  CHECK(a.extra == b.extra);
}

}  // namespace

TEST_CASE("a checkpoint comes back as it was saved", "[core][checkpoint]") {
  gw::test::TempDir dir;
  CHECK_FALSE(load_checkpoint(dir.path).has_value());  // none yet
  const Checkpoint saved = sample_checkpoint(1.5f, 7);
  save_checkpoint(dir.path + "/run", saved);  // the directory is created
  auto loaded = load_checkpoint(dir.path + "/run");
  REQUIRE(loaded);
  check_same(saved, *loaded);
  // The metadata, readable by people and scripts.
  std::ifstream json(dir.path + "/run/checkpoint.json");
  const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("\"step\":\"7\"") && Catch::Contains("\"epoch\":\"3\""));
}

TEST_CASE("a checkpoint write that did not finish leaves the previous one whole",
          "[core][checkpoint]") {
  gw::test::TempDir dir;
  const Checkpoint first = sample_checkpoint(1.0f, 10);
  save_checkpoint(dir.path, first);
  // What a process killed in the middle of the next save leaves: a partial temporary file.
  {
    std::ofstream torn(dir.path + "/checkpoint.safetensors.tmp-a1b2c3", std::ios::binary);
    torn << "\x40\x00\x00\x00\x00\x00\x00\x00{\"model/fc.weight\":{";
  }
  auto loaded = load_checkpoint(dir.path);
  REQUIRE(loaded);
  check_same(first, *loaded);
  // The next save replaces both.
  const Checkpoint second = sample_checkpoint(2.0f, 20);
  save_checkpoint(dir.path, second);
  loaded = load_checkpoint(dir.path);
  REQUIRE(loaded);
  check_same(second, *loaded);
  // Only the torn file (which a real save would never leave once done) besides the two.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path),
                      std::filesystem::directory_iterator{}) == 3);
}

namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// CRC-32C bit by bit, as any other tool computes it.
uint32_t reference_crc32c(const uint8_t* p, size_t size) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

TEST_CASE("crc32c is CRC-32C around its lanes, at an odd address, and continued",
          "[core][checkpoint]") {
  // Around the three-lane runs (3 x 4096 bytes), their joins and the 8-byte steps.
  std::vector<uint8_t> bytes(3 * 3 * 4096 + 40);
  uint32_t x = 12345;
  for (auto& b : bytes) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  CHECK(gw::crc32c(0, "123456789", 9) == 0xE3069283u);  // the standard check value
  for (size_t size : {size_t{0}, size_t{7}, size_t{8}, size_t{3 * 4096 - 1}, size_t{3 * 4096},
                      size_t{3 * 4096 + 13}, size_t{6 * 4096}, size_t{9 * 4096 + 33}})
    for (size_t at : {size_t{0}, size_t{3}}) {
      const uint8_t* p = bytes.data() + at;
      CHECK(gw::crc32c(0, p, size) == reference_crc32c(p, size));
      const size_t half = size / 2 + 5 > size ? size : size / 2 + 5;
      CHECK(gw::crc32c(gw::crc32c(0, p, half), p + half, size - half) == reference_crc32c(p, size));
    }
}

TEST_CASE("a checkpoint whose bytes changed after the save is refused, not loaded",
          "[core][checkpoint][errors]") {
  gw::test::TempDir dir;
  // Tensors of odd byte counts and none (the checksum's tail and its chaining across tensors),
  // and a program's extra key that ends as the checksum's field does, placeholder and all.
  Checkpoint saved = sample_checkpoint(1.5f, 7);
  saved.model.emplace("mask", full({3}, 1.0f).to(kBool));
  saved.model.emplace("half", full({3}, 0.25f).to(kFloat16));
  saved.model.emplace("none", zeros({0}));
  saved.extra.emplace("\"crc32c", "00000000");
  save_checkpoint(dir.path, saved);
  const std::string path = dir.path + "/checkpoint.safetensors";
  const std::vector<uint8_t> good = read_all(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | good[static_cast<size_t>(i)];
  const size_t data = 8 + header;
  REQUIRE(good.size() > data);
  // The checksum recorded is the standard CRC-32C of the whole file with its own 8 digits read
  // as zeros, in the file and in the JSON beside it.
  const std::string text(good.begin() + 8, good.begin() + static_cast<std::ptrdiff_t>(data));
  const size_t field = text.find(",\"crc32c\":\"");
  REQUIRE(field != std::string::npos);
  const size_t digits = 8 + field + 11;
  std::vector<uint8_t> zeroed = good;
  std::fill_n(zeroed.begin() + static_cast<std::ptrdiff_t>(digits), 8, '0');
  char want[9];
  std::snprintf(want, sizeof want, "%08x", reference_crc32c(zeroed.data(), zeroed.size()));
  CHECK(std::string(good.begin() + static_cast<std::ptrdiff_t>(digits),
                    good.begin() + static_cast<std::ptrdiff_t>(digits) + 8) == want);
  std::ifstream json(dir.path + "/checkpoint.json");
  CHECK_THAT(std::string(std::istreambuf_iterator<char>(json), std::istreambuf_iterator<char>()),
             Catch::Contains(want));
  auto refused = [&](size_t at, const std::string& replacement) {
    std::vector<uint8_t> bad = good;
    std::copy(replacement.begin(), replacement.end(),
              bad.begin() + static_cast<std::ptrdiff_t>(at));
    write_all(path, bad);
    CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("checkpoint.safetensors") &&
                                                     Catch::Contains("is corrupt: its CRC-32C"));
  };
  // One bit flipped anywhere in the tensors' bytes: the first, one in the middle, the last.
  for (size_t at : {data, (data + good.size()) / 2, good.size() - 1})
    refused(at, std::string(1, static_cast<char>(good[at] ^ 0x10)));
  // ... or in the header, where the JSON still parses and agrees with the tensors' sizes: another
  // step, a shape of the same size ([2,3] as [3,2]), the checksum's own digits.
  const size_t step = text.find("\"step\":\"7\"");
  REQUIRE(step != std::string::npos);
  refused(8 + step + 8, "6");
  const size_t shape = text.find("[2,3]");
  REQUIRE(shape != std::string::npos);
  refused(8 + shape, "[3,2]");
  refused(digits + 3, good[digits + 3] == '0' ? "1" : "0");
  // ... or bytes added after the last tensor's, which safetensors' offsets do not reach.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  write_all(path, longer);
  CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("is corrupt: its CRC-32C"));
  write_all(path, good);
  auto loaded = load_checkpoint(dir.path);
  REQUIRE(loaded);
  check_same(saved, *loaded);
  CHECK_FALSE(loaded->extra.contains("crc32c"));  // the checkpoint's own, not the program's
  // A header that lost its checksum (its key's name flipped) is refused too: format 2 has one; and
  // so is one whose format reads 1, which would have gone unchecked.
  std::vector<uint8_t> unnamed = good;
  unnamed[digits - 5] = '3';  // "crc32c" becomes "crc33c"
  write_all(path, unnamed);
  CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("is corrupt: its header has no "
                                                               "checksum"));
  const size_t format = text.find("gradwire-checkpoint-2");
  REQUIRE(format != std::string::npos);
  std::vector<uint8_t> older = good;
  older[8 + format + 20] = '1';
  write_all(path, older);
  CHECK_THROWS_WITH(load_checkpoint(dir.path),
                    Catch::Contains("is corrupt: its header has format 1 but format 2's checksum"));
}

TEST_CASE("a checkpoint of format 1 loads, checked by its tensors' checksum where it has one",
          "[core][checkpoint]") {
  gw::test::TempDir dir;
  const std::string path = dir.path + "/checkpoint.safetensors";
  // Written as format 1 was: the tensors' bytes in name order, summed alone.
  const Tensor w = full({3}, 2.0f), lr = full({}, 0.5, kFloat64);
  std::vector<uint8_t> bytes(static_cast<size_t>(lr.nbytes() + w.nbytes()));
  std::memcpy(bytes.data(), w.raw_data(), static_cast<size_t>(w.nbytes()));  // "model/w" first
  std::memcpy(bytes.data() + w.nbytes(), lr.raw_data(), static_cast<size_t>(lr.nbytes()));
  char sum[9];
  std::snprintf(sum, sizeof sum, "%08x", reference_crc32c(bytes.data(), bytes.size()));
  std::map<std::string, std::string> meta = {
      {"format", "gradwire-checkpoint-1"}, {"epoch", "1"}, {"step", "4"}, {"seed", "9"}};
  for (bool summed : {false, true}) {
    if (summed) meta["data_crc32c"] = sum;
    save_safetensors(path, {{"model/w", w}, {"optimizer/lr", lr}}, meta);
    auto loaded = load_checkpoint(dir.path);
    REQUIRE(loaded);
    CHECK(equal(loaded->model.at("w"), w));
    CHECK(loaded->step == 4);
    CHECK(loaded->extra.empty());
  }
  std::vector<uint8_t> bad = read_all(path);
  bad.back() ^= 0x10;
  write_all(path, bad);
  CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("is corrupt") &&
                                                   Catch::Contains("tensors' CRC-32C") &&
                                                   Catch::Contains(sum));
}

TEST_CASE("load_checkpoint refuses what is not a checkpoint, naming the file",
          "[core][checkpoint][errors]") {
  gw::test::TempDir dir;
  save_safetensors(dir.path + "/checkpoint.safetensors", {{"w", ones({2})}});
  CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("checkpoint.safetensors") &&
                                                   Catch::Contains("not a gradwire checkpoint"));
  {
    std::ofstream garbage(dir.path + "/checkpoint.safetensors", std::ios::binary);
    garbage << "not safetensors";
  }
  CHECK_THROWS_AS(load_checkpoint(dir.path), IoError);
  CHECK_THROWS_WITH(save_checkpoint("/proc/no/such/dir", sample_checkpoint(1, 1)),
                    Catch::Contains("/proc/no/such/dir"));
  Checkpoint own = sample_checkpoint(1, 1);
  own.extra["seed"] = "mine";  // written by the checkpoint itself: it would be lost
  CHECK_THROWS_WITH(save_checkpoint(dir.path + "/own", own),
                    Catch::Contains("extra key \"seed\"") && Catch::Contains("[save_checkpoint]"));
  for (const char* checksum : {"crc32c", "data_crc32c"}) {
    own.extra = {{checksum, "mine"}};
    CHECK_THROWS_WITH(save_checkpoint(dir.path + "/own", own),
                      Catch::Contains(std::string("extra key \"") + checksum + "\""));
  }
}
