// save_checkpoint / load_checkpoint: what goes in comes back, and a write that did not finish
// never replaces the checkpoint before it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

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
}
