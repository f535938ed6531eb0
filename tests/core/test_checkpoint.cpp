// save_checkpoint / load_checkpoint: what goes in comes back, and a write that did not finish
// never replaces the checkpoint before it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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

TEST_CASE("a checkpoint whose tensors' bytes changed after the save is refused, not loaded",
          "[core][checkpoint][errors]") {
  gw::test::TempDir dir;
  // Tensors of odd byte counts and none (the checksum's tail and its chaining across tensors),
  // and a program's extra key that ends as the checksum's field does, placeholder and all.
  Checkpoint saved = sample_checkpoint(1.5f, 7);
  saved.model.emplace("mask", full({3}, 1.0f).to(kBool));
  saved.model.emplace("half", full({3}, 0.25f).to(kFloat16));
  saved.model.emplace("none", zeros({0}));
  saved.extra.emplace("\"data_crc32c", "00000000");
  save_checkpoint(dir.path, saved);
  const std::string path = dir.path + "/checkpoint.safetensors";
  const std::vector<uint8_t> good = read_all(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | good[static_cast<size_t>(i)];
  const size_t data = 8 + header;
  REQUIRE(good.size() > data);
  // The checksum recorded is the standard CRC-32C of the data section, in the file and in the
  // JSON beside it.
  char want[9];
  std::snprintf(want, sizeof want, "%08x",
                reference_crc32c(good.data() + data, good.size() - data));
  const std::string text(good.begin() + 8, good.begin() + static_cast<std::ptrdiff_t>(data));
  CHECK_THAT(text, Catch::Contains(std::string("\"data_crc32c\":\"") + want + "\""));
  std::ifstream json(dir.path + "/checkpoint.json");
  CHECK_THAT(std::string(std::istreambuf_iterator<char>(json), std::istreambuf_iterator<char>()),
             Catch::Contains(want));
  // One bit flipped anywhere in the tensors' bytes: the first, one in the middle, the last.
  for (size_t at : {data, (data + good.size()) / 2, good.size() - 1}) {
    std::vector<uint8_t> bad = good;
    bad[at] ^= 0x10;
    write_all(path, bad);
    CHECK_THROWS_WITH(load_checkpoint(dir.path), Catch::Contains("checkpoint.safetensors") &&
                                                     Catch::Contains("is corrupt") &&
                                                     Catch::Contains(want));
  }
  write_all(path, good);
  auto loaded = load_checkpoint(dir.path);
  REQUIRE(loaded);
  check_same(saved, *loaded);
  CHECK_FALSE(loaded->extra.contains("data_crc32c"));  // the checkpoint's own, not the program's
}

TEST_CASE("a checkpoint from before checksums loads unchecked", "[core][checkpoint]") {
  gw::test::TempDir dir;
  save_safetensors(
      dir.path + "/checkpoint.safetensors",
      {{"model/w", full({3}, 2.0f)}, {"optimizer/lr", full({}, 0.5, kFloat64)}},
      {{"format", "gradwire-checkpoint-1"}, {"epoch", "1"}, {"step", "4"}, {"seed", "9"}});
  auto loaded = load_checkpoint(dir.path);
  REQUIRE(loaded);
  CHECK(equal(loaded->model.at("w"), full({3}, 2.0f)));
  CHECK(loaded->step == 4);
  CHECK(loaded->extra.empty());
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
  own.extra = {{"data_crc32c", "mine"}};
  CHECK_THROWS_WITH(save_checkpoint(dir.path + "/own", own),
                    Catch::Contains("extra key \"data_crc32c\""));
}
