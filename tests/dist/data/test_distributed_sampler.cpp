// DistributedSampler: each rank's share of an epoch, as PyTorch's sampler deals them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "dist/data/distributed_sampler.h"
#include "dist/process_group/init_process_group.h"

using gw::dist::DistributedSampler;

namespace {
// Every rank's indices for `epoch`, each from its own sampler (as each process makes one).
std::vector<std::vector<int64_t>> shares(int64_t size, int ranks, bool shuffle, bool drop_last,
                                         int64_t epoch, uint64_t seed = 7) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < ranks; ++r) {
    DistributedSampler s(size, {.num_replicas = ranks,
                                .rank = r,
                                .shuffle = shuffle,
                                .seed = seed,
                                .drop_last = drop_last});
    s.set_epoch(epoch);
    out.push_back(s.indices());
    CHECK(static_cast<int64_t>(out.back().size()) == s.num_samples());
  }
  return out;
}

std::map<int64_t, int> counts(const std::vector<std::vector<int64_t>>& all) {
  std::map<int64_t, int> c;
  for (const auto& share : all)
    for (int64_t i : share) ++c[i];
  return c;
}
}  // namespace

TEST_CASE("the ranks' shares cover the dataset once when the size divides", "[data][sampler]") {
  const auto all = shares(12, 3, true, false, 0);
  const auto c = counts(all);
  CHECK(c.size() == 12);
  for (const auto& [i, n] : c) {
    CHECK(i >= 0);
    CHECK(i < 12);
    CHECK(n == 1);
  }
  for (const auto& share : all) CHECK(share.size() == 4);
}

TEST_CASE("without drop_last the order is padded with its own start; with it, cut",
          "[data][sampler]") {
  const auto padded = shares(10, 3, true, false, 0);
  auto c = counts(padded);
  CHECK(c.size() == 10);  // every sample read
  int repeated = 0;
  for (const auto& [i, n] : c) repeated += n - 1;
  CHECK(repeated == 2);  // 4 per rank: 12 positions for 10 samples
  // The repeats are the first two of the epoch's order, which is rank 0's and rank 1's first.
  CHECK(c.at(padded[0][0]) == 2);
  CHECK(c.at(padded[1][0]) == 2);

  const auto cut = shares(10, 3, true, true, 0);
  c = counts(cut);
  CHECK(c.size() == 9);  // 3 per rank, all different
  for (const auto& share : cut) CHECK(share.size() == 3);

  const auto tiny = shares(2, 5, false, false, 0);  // fewer samples than ranks: repeated
  CHECK(tiny == std::vector<std::vector<int64_t>>{{0}, {1}, {0}, {1}, {0}});
  CHECK(shares(2, 5, false, true, 0) == std::vector<std::vector<int64_t>>(5));
}

TEST_CASE("the order is the same on every rank for an epoch, and changes with the epoch",
          "[data][sampler]") {
  CHECK(shares(100, 4, true, false, 3) == shares(100, 4, true, false, 3));
  CHECK(shares(100, 4, true, false, 3) != shares(100, 4, true, false, 4));
  CHECK(shares(100, 4, true, false, 3, 1) != shares(100, 4, true, false, 3, 2));  // the seed
  const auto in_order = shares(7, 2, false, false, 5);
  CHECK(in_order == std::vector<std::vector<int64_t>>{{0, 2, 4, 6}, {1, 3, 5, 0}});
  auto shuffled = shares(100, 1, true, false, 0)[0];
  CHECK(shuffled != shares(100, 1, false, false, 0)[0]);
  std::sort(shuffled.begin(), shuffled.end());
  CHECK(shuffled == shares(100, 1, false, false, 0)[0]);  // a permutation
}

TEST_CASE("bad sampler arguments are clear errors", "[data][sampler]") {
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 3, .rank = 3}),
                    Catch::Contains("rank 3 is not in [0, 3)"));
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 3, .rank = -2}),
                    Catch::Contains("rank -2 is not in [0, 3)"));
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 0, .rank = 0}),
                    Catch::Contains("num_replicas 0"));
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = -2, .rank = 0}),
                    Catch::Contains("num_replicas -2"));
  CHECK_THROWS_WITH(DistributedSampler(-1, {.num_replicas = 1, .rank = 0}),
                    Catch::Contains("dataset size -1"));
  REQUIRE_FALSE(gw::dist::is_initialized());
  CHECK_THROWS_AS(DistributedSampler(10), gw::StateError);  // no group to take defaults from
  CHECK(DistributedSampler(0, {.num_replicas = 2, .rank = 1}).indices().empty());
}
