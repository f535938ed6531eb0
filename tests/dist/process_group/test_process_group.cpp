// The Gloo process group with ranks as threads: every collective, dtype and op against values
// computed locally, at world sizes 1 to 4, and its errors.
#include <catch2/catch.hpp>

#include <future>
#include <string>

#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/collective_checks.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using namespace gw::dist;
using namespace std::chrono_literals;
using gw::dist::testing::check_every_collective;
using gw::dist::testing::Checks;
using gw::dist::testing::expected;
using gw::dist::testing::run_ranks;
using gw::dist::testing::values;

TEST_CASE("every collective, dtype and op at world sizes 1 to 4", "[process_group][gloo]") {
  for (int world = 1; world <= 4; ++world) {
    INFO("world " << world);
    run_ranks(world, [](ProcessGroupGloo& pg, Checks& c) { check_every_collective(pg, c); });
  }
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
