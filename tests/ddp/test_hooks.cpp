// DDP's compression hooks with ranks as threads over real Gloo: bf16 on the wire, and PowerSGD
// (exact at full rank, low rank and counted at rank 1, error feedback recovering what
// compression dropped).
#include <catch2/catch.hpp>

#include <cmath>

#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;

namespace {
constexpr int64_t kShard = 6;  // samples per rank

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 16, true, gen),
                                          std::make_shared<nn::ReLU>(),
                                          std::make_shared<nn::Linear>(16, 4, true, gen));
}

std::pair<Tensor, Tensor> batch(int world, int step) {
  Generator gen(2000 + static_cast<uint64_t>(step));
  return {randn({world * kShard, 8}, gen), randint(0, 4, {world * kShard}, gen)};
}

Tensor shard(const Tensor& t, int r) { return t.narrow(0, r * kShard, kShard); }

double norm(const Tensor& t) { return std::sqrt((t * t).sum().item<double>()); }

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

// Trains `steps` SGD steps with DDP through `hook` beside a single process on the whole batch;
// checks each step's gradients against it.
void train_beside_reference(dist::ProcessGroupGloo& pg, Checks& c, const ddp::CommHook& hook,
                            int steps, double rtol, double atol, ddp::DDPOptions options = {}) {
  const int world = pg.size();
  ddp::DistributedDataParallel model(mlp(5), borrow(pg), options);
  model.register_comm_hook(hook);
  auto reference = mlp(5);
  optim::SGD opt(model.module()->parameters(), optim::SGD::options(0.1));
  optim::SGD ref_opt(reference->parameters(), optim::SGD::options(0.1));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(world, step);
    opt.zero_grad();
    ref_opt.zero_grad();
    nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
        .backward();
    nn::functional::cross_entropy(reference->forward(x), y).backward();
    auto p = model.module()->parameters(), q = reference->parameters();
    for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i].grad(), q[i].grad(), rtol, atol));
    opt.step();
    ref_opt.step();
  }
}
}  // namespace

TEST_CASE("Gloo sums bfloat16 tensors, and only sums them", "[ddp][hooks]") {
  run_ranks(3, [](dist::ProcessGroupGloo& pg, Checks& c) {
    // Values exact in bfloat16, and sums that are too: the sum is exact.
    Tensor t = full({5}, 1.5 * (pg.rank() + 1)).to(kBFloat16);
    pg.allreduce(t, {.op = dist::ReduceOp::SUM})->wait();
    EXPECT(c, equal(t.to(kFloat32), full({5}, 9.0)));
    Tensor u = ones({2}).to(kBFloat16);
    EXPECT_THROWS(c, InvalidArgumentError, pg.allreduce(u, {.op = dist::ReduceOp::MAX})->wait(),
                  "bfloat16 tensors are reduced with SUM only, got MAX");
  });
}

TEST_CASE("bf16 compression averages within bfloat16's precision", "[ddp][hooks]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    train_beside_reference(pg, c, ddp::hooks::bf16_compress(), 2, 2e-2, 2e-3);
    // What came back is bfloat16 widened: every gradient survives a round trip through it.
    ddp::DistributedDataParallel model(mlp(5), borrow(pg));
    model.register_comm_hook(ddp::hooks::bf16_compress());
    auto [x, y] = batch(2, 0);
    nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
        .backward();
    for (const Tensor& p : model.module()->parameters())
      EXPECT(c, equal(p.grad(), p.grad().to(kBFloat16).to(kFloat32)));
  });
}

TEST_CASE("PowerSGD at full rank is exact, error feedback and all", "[ddp][hooks][powersgd]") {
  // At rank min(n, m) P spans the summed gradient's columns and P Q^T is the average itself;
  // each rank's error is its own gradient minus the average, which sums to zero over the ranks.
  for (bool batched : {false, true}) {
    INFO((batched ? "batched" : "per tensor"));
    run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      auto state = std::make_shared<ddp::PowerSGDState>(
          ddp::PowerSGDOptions{.matrix_approximation_rank = 1000,
                               .start_powerSGD_iter = 2,
                               .min_compression_rate = 1e-9});  // every matrix compressed
      train_beside_reference(
          pg, c, batched ? ddp::hooks::batched_powersgd(state) : ddp::hooks::powersgd(state), 5,
          1e-4, 1e-6, {.bucket_cap_mb = 1e-3, .first_bucket_cap_mb = 1e-3});  // several buckets
      EXPECT(c, state->iteration() == 5);
      // Three compressed passes: every number of the gradients counted before compression.
      EXPECT(c, state->compression_stats().numel_before == 3 * (8 * 16 + 16 + 16 * 4 + 4));
    });
  }
}

TEST_CASE("PowerSGD at rank 1 sends rank-1 gradients, the same on every rank",
          "[ddp][hooks][powersgd]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto state = std::make_shared<ddp::PowerSGDState>(
        ddp::PowerSGDOptions{.matrix_approximation_rank = 1, .start_powerSGD_iter = 2});
    ddp::DistributedDataParallel model(mlp(5), borrow(pg));
    model.register_comm_hook(ddp::hooks::powersgd(state));
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(2, step);
      model.module()->zero_grad();
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
    }
    // The first weight (16 x 8: (16 + 8) * 1 * 2 < 128, compressed) is of rank 1: every 2 x 2
    // minor vanishes. Passes 0 and 1 averaged plainly; pass 2 compressed.
    const std::vector<float> w = model.module()->parameters()[0].grad().to_vector<float>();
    double scale = 0, largest_minor = 0;
    for (float v : w) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (size_t i = 0; i + 1 < 16; ++i)
      for (size_t j = 0; j + 1 < 8; ++j)
        largest_minor = std::max(
            largest_minor, std::abs(static_cast<double>(w[i * 8 + j]) * w[i * 8 + 8 + j + 1] -
                                    static_cast<double>(w[i * 8 + j + 1]) * w[i * 8 + 8 + j]));
    EXPECT(c, scale > 0 && largest_minor < 1e-5 * scale * scale);
    // Every rank decompressed the same gradients.
    for (const Tensor& p : model.module()->parameters()) {
      Tensor theirs = p.grad().clone();
      pg.broadcast(theirs, {.root = 0})->wait();
      EXPECT(c, equal(theirs, p.grad()));
    }
    // The 4 x 16 weight: (4 + 16) * 2 = 40 < 64, compressed too. The numbers on the wire of the
    // compressed pass: the biases (16 + 4), P and Q of each weight (16 + 8, 4 + 16).
    const auto stats = state->compression_stats();
    EXPECT(c, stats.numel_before == 8 * 16 + 16 + 16 * 4 + 4);
    EXPECT(c, stats.numel_after == 16 + 4 + (16 + 8) + (4 + 16));
    EXPECT(c, stats.rate() > 3);
  });
}

TEST_CASE("PowerSGD's error feedback delivers what compression held back",
          "[ddp][hooks][powersgd]") {
  // The same gradients every pass (no step): with error feedback, the sum of what rank-1
  // compression delivered over K passes is K times the average less one error, so its mean
  // approaches the average; without, it stays a rank-1 approximation.
  for (bool feedback : {true, false}) {
    INFO("error feedback " << feedback);
    run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      auto state = std::make_shared<ddp::PowerSGDState>(
          ddp::PowerSGDOptions{.matrix_approximation_rank = 1,
                               .start_powerSGD_iter = 2,
                               .use_error_feedback = feedback});
      ddp::DistributedDataParallel model(mlp(5), borrow(pg));
      model.register_comm_hook(ddp::hooks::powersgd(state));
      auto reference = mlp(5);
      auto [x, y] = batch(2, 0);
      nn::functional::cross_entropy(reference->forward(x), y).backward();
      const Tensor average = reference->parameters()[0].grad();
      constexpr int kPasses = 60;
      Tensor delivered = zeros_like(average);
      for (int pass = 0; pass < kPasses; ++pass) {
        model.module()->zero_grad();
        nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
            .backward();
        if (pass >= 2) delivered.add_(model.module()->parameters()[0].grad());
      }
      const double error = norm(delivered / double(kPasses - 2) - average) / norm(average);
      EXPECT(c, feedback ? error < 0.1 : error > 0.2);
    });
  }
}

TEST_CASE("PowerSGD's options are checked", "[ddp][hooks][powersgd]") {
  CHECK_THROWS_WITH(ddp::PowerSGDState({.matrix_approximation_rank = 0}),
                    Catch::Contains("matrix_approximation_rank must be at least 1, got 0"));
  CHECK_THROWS_WITH(
      ddp::PowerSGDState({.start_powerSGD_iter = 1}),
      Catch::Contains("start_powerSGD_iter must be at least 2") && Catch::Contains("got 1"));
  CHECK_NOTHROW(ddp::PowerSGDState(
      {.start_powerSGD_iter = 0, .use_error_feedback = false, .warm_start = false}));
  CHECK_THROWS_WITH(ddp::PowerSGDState({.min_compression_rate = -1}),
                    Catch::Contains("min_compression_rate must be positive, got -1"));
  CHECK_THROWS_WITH(ddp::hooks::powersgd(nullptr), Catch::Contains("[powerSGD] the state is null"));
}
