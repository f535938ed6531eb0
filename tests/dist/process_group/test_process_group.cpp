// The Gloo process group with ranks as threads: every collective, dtype and op against values
// computed locally, at world sizes 1 to 4, and its errors.
#include <catch2/catch.hpp>

#include <functional>
#include <mutex>
#include <string>
#include <future>

#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "dist/store/hash_store.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using namespace gw::dist;
using namespace std::chrono_literals;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;

namespace {
// Rank r's tensor of a case: values that differ per rank and per element.
Tensor values(int r, DType dtype, int64_t n = 5) {
  return (arange(n, kFloat64) + (r + 1) * 10.0 + 1.0).to(dtype);
}

Tensor expected(dist::ReduceOp op, int world, DType dtype, int64_t n = 5) {
  Tensor acc = values(0, kFloat64, n);
  for (int r = 1; r < world; ++r) {
    Tensor v = values(r, kFloat64, n);
    switch (op) {
      case dist::ReduceOp::SUM:
      case dist::ReduceOp::AVG: acc = acc + v; break;
      case dist::ReduceOp::PRODUCT: acc = acc * v; break;
      case dist::ReduceOp::MIN: acc = minimum(acc, v); break;
      case dist::ReduceOp::MAX: acc = maximum(acc, v); break;
    }
  }
  if (op == dist::ReduceOp::AVG) acc = acc / static_cast<double>(world);
  return acc.to(dtype);
}
}  // namespace

TEST_CASE("allreduce: every op and dtype at world sizes 1 to 4", "[process_group][gloo]") {
  for (int world = 1; world <= 4; ++world) {
    run_ranks(world, [world](ProcessGroupGloo& pg, Checks& c) {
      for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64})
        for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::PRODUCT, dist::ReduceOp::MIN,
                            dist::ReduceOp::MAX}) {
          if (op == dist::ReduceOp::AVG && !is_floating(dtype)) continue;
          Tensor t = values(pg.rank(), dtype);
          pg.allreduce(t, {.op = op})->wait();
          c.expect(allclose(t.to(kFloat64), expected(op, world, dtype).to(kFloat64)),
                   gw::detail::str("allreduce world ", world, " ", dtype_name(dtype), " ",
                                   to_string(op)));
        }
    });
  }
}

TEST_CASE("broadcast, reduce, allgather, gather and scatter", "[process_group][gloo]") {
  for (int world : {1, 3}) {
    run_ranks(world, [world](ProcessGroupGloo& pg, Checks& c) {
      const int r = pg.rank();
      for (int root = 0; root < world; ++root) {
        Tensor b = values(r, kFloat32);
        pg.broadcast(b, {.root = root})->wait();
        EXPECT(c, equal(b, values(root, kFloat32)));

        Tensor red = values(r, kInt64);
        pg.reduce(red, {.root = root, .op = dist::ReduceOp::SUM})->wait();
        EXPECT(c, equal(red, r == root ? expected(dist::ReduceOp::SUM, world, kInt64)
                                   : values(r, kInt64)));  // others keep theirs

        std::vector<Tensor> gathered;
        if (r == root)
          for (int i = 0; i < world; ++i) gathered.push_back(empty({5}, kFloat64));
        pg.gather(gathered, values(r, kFloat64), {.root = root})->wait();
        for (int i = 0; i < static_cast<int>(gathered.size()); ++i)
          EXPECT(c, equal(gathered[i], values(i, kFloat64)));

        std::vector<Tensor> parts;
        if (r == root)
          for (int i = 0; i < world; ++i) parts.push_back(values(100 + i, kInt32));
        Tensor mine = empty({5}, kInt32);
        pg.scatter(mine, parts, {.root = root})->wait();
        EXPECT(c, equal(mine, values(100 + r, kInt32)));
      }
      std::vector<Tensor> all;
      for (int i = 0; i < world; ++i) all.push_back(empty({2, 3}, kFloat32));
      pg.allgather(all, values(r, kFloat32, 6).reshape({2, 3}))->wait();
      for (int i = 0; i < world; ++i) EXPECT(c, equal(all[i], values(i, kFloat32, 6).reshape({2, 3})));
    });
  }
}

TEST_CASE("reduce_scatter, alltoall, coalesced allreduce, barrier, send and recv",
          "[process_group][gloo]") {
  run_ranks(3, [](ProcessGroupGloo& pg, Checks& c) {
    const int r = pg.rank(), world = pg.size();
    // reduce_scatter: rank r gets the sum over ranks of their inputs[r].
    std::vector<Tensor> inputs;
    for (int i = 0; i < world; ++i) inputs.push_back(values(r * 10 + i, kFloat64));
    Tensor out = empty({5}, kFloat64);
    pg.reduce_scatter(out, inputs)->wait();
    Tensor want = zeros({5}, kFloat64);
    for (int s = 0; s < world; ++s) want = want + values(s * 10 + r, kFloat64);
    EXPECT(c, allclose(out, want));

    // alltoall: outputs[j] is what rank j sent to this rank.
    std::vector<Tensor> send_parts, recv_parts;
    for (int i = 0; i < world; ++i) {
      send_parts.push_back(values(r * 10 + i, kInt64));
      recv_parts.push_back(empty({5}, kInt64));
    }
    pg.alltoall(recv_parts, send_parts)->wait();
    for (int j = 0; j < world; ++j) EXPECT(c, equal(recv_parts[j], values(j * 10 + r, kInt64)));

    // Several tensors of different shapes reduced as one buffer.
    std::vector<Tensor> many{values(r, kFloat32, 3), values(r, kFloat32, 7).reshape({7, 1})};
    pg.allreduce_coalesced(many)->wait();
    EXPECT(c, allclose(many[0], expected(dist::ReduceOp::SUM, world, kFloat32, 3)));
    EXPECT(c, allclose(many[1], expected(dist::ReduceOp::SUM, world, kFloat32, 7).reshape({7, 1})));

    pg.barrier()->wait();

    // A ring of send/recv, both posted before either is waited for.
    Tensor got = empty({5}, kFloat32);
    auto sent = pg.send(values(r, kFloat32), (r + 1) % world, /*tag=*/7);
    auto received = pg.recv(got, (r + world - 1) % world, 7);
    sent->wait();
    received->wait();
    EXPECT(c, equal(got, values((r + world - 1) % world, kFloat32)));
    EXPECT(c, sent->is_success());
  });
}

TEST_CASE("collectives reject bad arguments with clear errors", "[process_group][gloo][errors]") {
  run_ranks(2, [](ProcessGroupGloo& pg, Checks& c) {
    Tensor t = values(pg.rank(), kInt64);
    EXPECT_THROWS(c, std::exception, pg.allreduce(t, {.op = dist::ReduceOp::AVG}), "AVG needs a floating point tensor");
    EXPECT_THROWS(c, std::exception, pg.broadcast(t, {.root = 2}), "root 2 is outside [0, 2)");
    std::vector<Tensor> one{empty({5}, kInt64)};
    EXPECT_THROWS(c, std::exception, pg.allgather(one, t), "needs 2 outputs");
    std::vector<Tensor> wrong{empty({5}, kInt64), empty({4}, kInt64)};
    EXPECT_THROWS(c, std::exception, pg.allgather(wrong, t), "5 elements of int64; got 4");
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
    EXPECT_THROWS(c, std::exception, pg.check_same_shape(mine, "fc1.weight"), "fc1.weight", "(3, 4) float32", "(4, 3) float32");
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
    EXPECT_THROWS(c, std::exception, work->wait());  // rank 1 left: its connections close, or the barrier times out
    EXPECT(c, !(work->is_success()));
  });
}
