// The Gloo process group with ranks as threads: every collective, dtype and op against values
// computed locally, at world sizes 1 to 4, and its errors.
#include <catch2/catch.hpp>

#include <cstring>
#include <future>
#include <optional>
#include <string>

#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/collective_checks.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/scoped_env.h"

using namespace gw;
using namespace gw::dist;
using namespace std::chrono_literals;
using gw::dist::testing::check_every_collective;
using gw::dist::testing::Checks;
using gw::dist::testing::expected;
using gw::dist::testing::run_ranks;
using gw::dist::testing::values;

TEST_CASE("every collective, dtype and op at world sizes 1 to 4", "[process_group][gloo]") {
  const bool shm = GENERATE(true, false);  // allreduce through shared memory, or Gloo's TCP
  for (int world = 1; world <= 4; ++world) {
    INFO("world " << world << (shm ? ", shared memory" : ", TCP"));
    run_ranks(world,
              [&](ProcessGroupGloo& pg, Checks& c) {
                EXPECT(c, pg.uses_shared_memory() == (shm && world > 1));
                check_every_collective(pg, c);
              },
              {.shared_memory = shm});
  }
}

// Shared memory (dist/process_group/shm_collectives.h) goes through a buffer in chunks of a
// slot, each split in one part per rank: sizes around a chunk's, at a world size that does not
// divide them, reduce and gather exactly (int64, bfloat16 of small integers) and leave the same
// bits on every rank (float32, whose sum depends on its order).
TEST_CASE("collectives through shared memory across chunks, exact and the same on every rank",
          "[process_group][gloo][shm]") {
  constexpr int kWorld = 3;
  const int64_t chunk = (int64_t{1} << 20) / 8;  // int64 elements in a slot of 1 MiB
  // 4 chunks + 3: past a chunk of 2-byte elements too.
  for (int64_t n : {int64_t{1}, int64_t{17}, chunk - 1, 2 * chunk + 7, 4 * chunk + 3}) {
    INFO(n << " elements");
    std::vector<Tensor> floats(kWorld);
    run_ranks(
        kWorld,
        [&](ProcessGroupGloo& pg, Checks& c) {
          EXPECT(c, pg.uses_shared_memory());
          Tensor t = arange(n, kInt64) * (pg.rank() + 1);
          pg.allreduce(t)->wait();
          EXPECT(c, equal(t, arange(n, kInt64) * (kWorld * (kWorld + 1) / 2)));
          // 0..7 over and over: small integers, which bfloat16 sums exactly.
          Tensor cycle =
              arange(8, kInt64).view({1, 8}).expand({(n + 7) / 8, 8}).reshape({-1}).narrow(0, 0, n);
          Tensor h = (cycle * (pg.rank() + 1)).to(kBFloat16);
          pg.allreduce(h)->wait();
          EXPECT(c, equal(h.to(kInt64), cycle * (kWorld * (kWorld + 1) / 2)));
          // Block b of rank r's input holds index + 10 b + r; rank r gets its block summed.
          Tensor blocks = arange(n, kInt64).view({1, n}) +
                          (arange(kWorld, kInt64) * 10).view({kWorld, 1}) + pg.rank();
          Tensor flat = blocks.reshape({kWorld * n});
          Tensor mine = empty({n}, kInt64);
          pg.reduce_scatter_tensor(mine, flat)->wait();
          EXPECT(c, equal(mine, (arange(n, kInt64) + pg.rank() * 10) * kWorld +
                                    kWorld * (kWorld - 1) / 2));
          Tensor sent = arange(n, kInt64) + pg.rank() * 1000;  // from rank 2
          pg.broadcast(sent, {.root = 2})->wait();
          EXPECT(c, equal(sent, arange(n, kInt64) + 2000));
          Tensor gathered = empty({kWorld * n}, kInt64);
          pg.all_gather_into_tensor(gathered, arange(n, kInt64) + pg.rank() * 1000)->wait();
          EXPECT(c, equal(gathered, (arange(n, kInt64).view({1, n}) +
                                     (arange(kWorld, kInt64) * 1000).view({kWorld, 1}))
                                        .reshape({kWorld * n})));
          // allreduce_coalesced reduces its tensors where they are: pieces across the chunks and
          // the ranks' parts (and an empty one); a tensor given twice is still reduced once.
          const int64_t cut = n / 3;
          Tensor whole = arange(n, kInt64) * (pg.rank() + 1);
          std::vector<Tensor> pieces = {whole.narrow(0, 0, cut).clone(), empty({0}, kInt64),
                                        whole.narrow(0, cut, n - cut).clone()};
          pg.allreduce_coalesced(pieces)->wait();
          EXPECT(c, equal(cat(pieces), arange(n, kInt64) * (kWorld * (kWorld + 1) / 2)));
          // Many pieces of 1 to 4 elements, across the ranks' parts; then one that ends where the
          // first chunk does, and more small ones after it.
          std::vector<Tensor> small;
          for (int64_t at = 0, k = 0; at < n; ++k) {
            const int64_t len = std::min(n - at, k == 32  ? std::max<int64_t>(chunk - at, 1)
                                                 : k > 64 ? n
                                                          : k % 4 + 1);
            small.push_back(whole.narrow(0, at, len).clone());
            at += len;
          }
          pg.allreduce_coalesced(small)->wait();
          EXPECT(c, equal(cat(small), arange(n, kInt64) * (kWorld * (kWorld + 1) / 2)));
          std::vector<Tensor> twice = {whole, whole};
          pg.allreduce_coalesced(twice)->wait();
          EXPECT(c, equal(whole, arange(n, kInt64) * (kWorld * (kWorld + 1) / 2)));
          Generator gen(static_cast<uint64_t>(pg.rank()));
          Tensor f = randn({n}, gen);
          std::vector<Tensor> parts = {f.narrow(0, 0, cut).clone(),
                                       f.narrow(0, cut, n - cut).clone()};
          pg.allreduce(f, {.op = dist::ReduceOp::AVG})->wait();
          floats[pg.rank()] = f;
          // Averaged in pieces, the same bits as averaged whole.
          pg.allreduce_coalesced(parts, {.op = dist::ReduceOp::AVG})->wait();
          Tensor joined = cat(parts);
          EXPECT(c, std::memcmp(joined.raw_data(), f.raw_data(), f.nbytes()) == 0);
        },
        {.shared_memory = true});
    for (int r = 1; r < kWorld; ++r)
      CHECK(std::memcmp(floats[r].raw_data(), floats[0].raw_data(), floats[0].nbytes()) == 0);
  }
}

TEST_CASE("shared memory is off for the whole group when one rank turns it off",
          "[process_group][gloo][shm]") {
  const bool by_env = GENERATE(false, true);
  auto store = std::make_shared<gw::store::HashStore>();
  Checks checks;
  std::vector<std::future<void>> ranks;
  std::optional<test::ScopedEnv> off;
  if (by_env) off.emplace("GW_GLOO_SHM", "0");  // read by each rank's constructor
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      GlooOptions options;
      if (!by_env && r == 1) options.shared_memory = false;
      if (by_env && r == 0) options.shared_memory = true;  // the options win over the variable
      ProcessGroupGloo pg(store, r, 2, options);
      EXPECT(checks, !pg.uses_shared_memory());
      Tensor t = values(r, kFloat64);
      pg.allreduce(t)->wait();
      EXPECT(checks, allclose(t, expected(dist::ReduceOp::SUM, 2, kFloat64)));
    }));
  for (auto& f : ranks) f.get();
  gw::dist::testing::require_passed(checks);
}

TEST_CASE("ranks that disagree on a collective through shared memory all fail, naming both",
          "[process_group][gloo][shm][errors]") {
  const int64_t other = GENERATE(8, 0);  // an empty tensor meets the others too
  run_ranks(2,
            [&](ProcessGroupGloo& pg, Checks& c) {
              Tensor t = ones({pg.rank() == 0 ? 4 : other});
              EXPECT_THROWS(c, InvalidArgumentError, pg.allreduce(t)->wait(), "disagree",
                            "4 elements of float32 SUM",
                            std::to_string(other) + " elements of float32");
              EXPECT_THROWS(c, std::exception, pg.allreduce(t)->wait(), "unusable");
            },
            {.shared_memory = true});
  // The same count, dtype and op in another collective (it would read the slots laid out
  // otherwise).
  run_ranks(2,
            [&](ProcessGroupGloo& pg, Checks& c) {
              Tensor out = ones({4});
              Tensor in = ones({8});
              EXPECT_THROWS(
                  c, InvalidArgumentError,
                  (pg.rank() == 0 ? pg.allreduce(out) : pg.reduce_scatter_tensor(out, in))->wait(),
                  "disagree", "in an allreduce", "in a reduce-scatter");
            },
            {.shared_memory = true});
  // A barrier beside an allreduce of nothing, a broadcast from another root.
  run_ranks(2,
            [&](ProcessGroupGloo& pg, Checks& c) {
              Tensor none = empty({0});
              EXPECT_THROWS(c, InvalidArgumentError,
                            (pg.rank() == 0 ? pg.barrier() : pg.allreduce(none))->wait(),
                            "disagree", "in a barrier", "in an allreduce");
            },
            {.shared_memory = true});
  run_ranks(2,
            [&](ProcessGroupGloo& pg, Checks& c) {
              Tensor t = ones({4});
              EXPECT_THROWS(c, InvalidArgumentError, pg.broadcast(t, {.root = pg.rank()})->wait(),
                            "disagree", "from root 0", "from root 1");
            },
            {.shared_memory = true});
}

TEST_CASE("collectives reject bad arguments with clear errors", "[process_group][gloo][errors]") {
  run_ranks(2, [](ProcessGroupGloo& pg, Checks& c) {
    Tensor t = values(pg.rank(), kInt64);
    EXPECT_THROWS(c, std::exception, pg.allreduce(t, {.op = dist::ReduceOp::AVG}),
                  "AVG needs a floating point tensor");
    EXPECT_THROWS(c, std::exception, pg.broadcast(t, {.root = 2}), "root 2 is outside [0, 2)");
    std::vector<Tensor> one{empty({5}, kInt64)};
    EXPECT_THROWS(c, std::exception, pg.allgather(one, t), "needs 2 outputs");
    std::vector<Tensor> wrong{empty({5}, kInt64), empty({4}, kInt64)};
    EXPECT_THROWS(c, std::exception, pg.allgather(wrong, t), "5 elements of int64; got 4");
    EXPECT_THROWS(c, InvalidArgumentError, pg.gather(one, t, {.root = 1 - pg.rank()}),
                  "only the root (rank", "takes outputs");
    Tensor strided = zeros({4, 4}).t();
    EXPECT_THROWS(c, std::exception, pg.allreduce(strided), "must be contiguous");
    EXPECT_THROWS(c, InvalidArgumentError, pg.send(t, pg.rank()), "cannot send to itself");
    Tensor flags = zeros({2}, kBool);
    EXPECT_THROWS(c, std::exception, pg.allreduce(flags), "allreduce");
    // The group still works: argument errors are raised before anything is queued.
    pg.allreduce(t)->wait();
    EXPECT(c, equal(t, expected(dist::ReduceOp::SUM, 2, kInt64)));
  });
}

TEST_CASE("check_same_shape names both shapes when ranks disagree", "[process_group][gloo]") {
  run_ranks(2, [](ProcessGroupGloo& pg, Checks& c) {
    pg.check_same_shape(zeros({3, 4}), "weights");  // agree: no error
    Tensor mine = pg.rank() == 0 ? zeros({3, 4}) : zeros({4, 3});
    EXPECT_THROWS(c, std::exception, pg.check_same_shape(mine, "fc1.weight"), "fc1.weight",
                  "(3, 4) float32", "(4, 3) float32");
  });
}

TEST_CASE("a rank that does not join a collective fails it on the others within the timeout",
          "[process_group][gloo][errors]") {
  std::promise<void> failed;
  std::shared_future<void> rank0_failed = failed.get_future().share();
  run_ranks(2, [&](ProcessGroupGloo& pg, Checks& c) {
    if (pg.rank() == 1) {  // alive, but never calls allreduce
      rank0_failed.wait();
      return;
    }
    Tensor t = ones({4});
    auto started = std::chrono::steady_clock::now();
    auto work = pg.allreduce(t, {.timeout = 300ms});
    EXPECT_THROWS(c, TimeoutError, work->wait());
    EXPECT(c, std::chrono::steady_clock::now() - started < 10s);
    // The group is unusable afterwards, and says why.
    EXPECT_THROWS(c, std::exception, pg.barrier()->wait(), "unusable after an earlier failure");
    failed.set_value();
  });
}

TEST_CASE("a rank that leaves fails the collectives of the others at once",
          "[process_group][gloo][errors]") {
  run_ranks(2, [](ProcessGroupGloo& pg, Checks& c) {
    if (pg.rank() == 1) return;  // its group closes its connections
    Tensor t = ones({4});
    auto started = std::chrono::steady_clock::now();
    EXPECT_THROWS(c, IoError, pg.allreduce(t, {.timeout = 60000ms})->wait());
    EXPECT(c, std::chrono::steady_clock::now() - started < 30s);  // not the minute of the timeout
  });
}

TEST_CASE("Work::wait with a timeout returns while the collective still runs",
          "[process_group][gloo]") {
  std::promise<void> checked;
  std::shared_future<void> rank0_checked = checked.get_future().share();
  run_ranks(2, [&](ProcessGroupGloo& pg, Checks& c) {
    if (pg.rank() == 1) {  // never joins the barrier; leaves once rank 0 has looked
      rank0_checked.wait();
      return;
    }
    auto work = pg.barrier({.timeout = 5000ms});
    EXPECT_THROWS(c, TimeoutError, work->wait(100ms));
    EXPECT(c, !(work->is_completed()));
    checked.set_value();
    EXPECT_THROWS(c, std::exception,
                  work->wait());  // rank 1 left: its connections close, or the barrier times out
    EXPECT(c, !(work->is_success()));
  });
}
