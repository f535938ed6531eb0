// DDP's compression hooks with ranks as threads over real Gloo: bf16 on the wire, and PowerSGD
// (exact at full rank, low rank and counted at rank 1, error feedback recovering what
// compression dropped, and inside a Join on uneven inputs).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "dist/algorithms/join.h"
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
  // Buckets of a few parameters, or of one each: then a bias's bucket has no matrix, and its
  // plain allreduce alone is what the next stage waits for (on the group's thread).
  for (bool batched : {false, true})
    for (double cap_mb : {1e-3, 1e-4}) {
      INFO((batched ? "batched" : "per tensor") << ", buckets of " << cap_mb << " MB");
      run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
        auto state = std::make_shared<ddp::PowerSGDState>(
            ddp::PowerSGDOptions{.matrix_approximation_rank = 1000,
                                 .start_powerSGD_iter = 2,
                                 .min_compression_rate = 1e-9});  // every matrix compressed
        train_beside_reference(
            pg, c, batched ? ddp::hooks::batched_powersgd(state) : ddp::hooks::powersgd(state), 5,
            1e-4, 1e-6, {.bucket_cap_mb = cap_mb, .first_bucket_cap_mb = cap_mb});
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

// --- PowerSGD inside a Join --------------------------------------------------------------------

namespace {
constexpr int64_t kJoinRows = 5;  // samples per batch
constexpr double kJoinLr = 0.1;
constexpr int64_t kStartPowerSGD = 2;

// Float64, so that exact means exact. Two buckets, each with a matrix to compress (a bucket of
// uncompressed tensors only can hang the hook today: its decompression may run on the group's
// thread and wait there for its allreduce, queued behind it): the last layer's (4 + 4 x 15 = 8 x 8
// elements) and the first layer's (15 + 15 x 14 = 15 x 15), so that batched PowerSGD's square
// matrices need no padding (a padded matrix has rows of zeros, and
// Gram-Schmidt cannot find the basis it needs at full rank: its products are then not exact);
// tanh leaves no dead units (rows of zeros) either.
std::shared_ptr<nn::Sequential> square_net() {
  Generator gen(5);
  auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(14, 15, true, gen),
                                            std::make_shared<nn::Tanh>(),
                                            std::make_shared<nn::Linear>(15, 4, true, gen));
  m->to(kFloat64);
  return m;
}
constexpr int64_t kSquareNumel = 15 * 14 + 15 + 4 * 15 + 4;
// The first bucket holds the last layer (512 bytes) but not the next bias (120 more).
constexpr double kFirstBucketMb = 576.0 / (1 << 20);

// Rank r's batch of iteration i.
std::pair<Tensor, Tensor> rank_batch(int r, int i) {
  Generator gen(700 + static_cast<uint64_t>(100 * r + i));
  return {randn({kJoinRows, 14}, gen, kFloat64), randint(0, 4, {kJoinRows}, gen)};
}

// The single-process run over the same data (test_join.cpp's semantics, divided by the initial
// world size as the built-in hooks divide): in iteration i, the sum of the gradients of the ranks
// that still have a batch, over the world size. Each iteration's gradients, and the parameters
// at the end.
struct DataSeen {
  std::vector<std::vector<Tensor>> grads;
  std::vector<Tensor> final_params;
};

DataSeen data_seen(const std::vector<int>& batches) {
  auto model = square_net();
  optim::SGD opt(model->parameters(), optim::SGD::options(kJoinLr));
  const int world = static_cast<int>(batches.size());
  const int iterations = *std::max_element(batches.begin(), batches.end());
  DataSeen ref;
  for (int i = 0; i < iterations; ++i) {
    std::vector<Tensor> xs, ys;
    for (int r = 0; r < world; ++r)
      if (i < batches[static_cast<size_t>(r)]) {
        auto [x, y] = rank_batch(r, i);
        xs.push_back(x), ys.push_back(y);
      }
    opt.zero_grad();
    (nn::functional::cross_entropy(model->forward(cat(xs, 0)), cat(ys, 0)) *
     (static_cast<double>(xs.size()) / world))
        .backward();
    std::vector<Tensor> g;
    for (const Tensor& p : model->parameters()) g.push_back(p.grad().clone());
    ref.grads.push_back(std::move(g));
    opt.step();
  }
  for (const Tensor& p : model->parameters()) ref.final_params.push_back(p.detach().clone());
  return ref;
}

// What the ranks of a run saw: each rank's gradients of each iteration it trained, and its
// parameters after join().
struct JoinRun {
  std::vector<std::vector<std::vector<Tensor>>> grads{3};
  std::vector<std::vector<Tensor>> final_params{3};
};

// 3 ranks train on `batches[rank]` batches with full-rank PowerSGD (every matrix compressed, two
// buckets) inside a Join that divides by the initial world size. Checks on every rank
// that training finishes, that every rank's PowerSGD counted every pass (its own and those it
// shadowed), and that every rank ends with the same parameters.
JoinRun train_powersgd_in_join(const std::vector<int>& batches, bool batched) {
  const int iterations = *std::max_element(batches.begin(), batches.end());
  JoinRun run;
  std::mutex mu;
  run_ranks(3,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              auto state = std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDOptions{
                  .matrix_approximation_rank = 1000,  // min(n, m) of each matrix
                  .start_powerSGD_iter = kStartPowerSGD,
                  .min_compression_rate = 1e-9});
              ddp::DistributedDataParallel model(square_net(), borrow(pg),
                                                 {.first_bucket_cap_mb = kFirstBucketMb});
              model.register_comm_hook(batched ? ddp::hooks::batched_powersgd(state)
                                               : ddp::hooks::powersgd(state));
              dist::Join join({&model}, {.divide_by_initial_world_size = true});
              optim::SGD opt(model.module()->parameters(), optim::SGD::options(kJoinLr));
              std::vector<std::vector<Tensor>> grads;
              for (int i = 0; i < batches[static_cast<size_t>(pg.rank())]; ++i) {
                auto [x, y] = rank_batch(pg.rank(), i);
                opt.zero_grad();
                nn::functional::cross_entropy(model(x), y).backward();
                std::vector<Tensor> g;
                for (const Tensor& p : model.module()->parameters()) g.push_back(p.grad().clone());
                grads.push_back(std::move(g));
                opt.step();
              }
              join.join();
              EXPECT(c, state->iteration() == iterations);
              EXPECT(c, state->compression_stats().numel_before ==
                            (iterations - kStartPowerSGD) * kSquareNumel);
              EXPECT(c, model.reducer().buckets().size() == 2);
              std::vector<Tensor> final_params;
              for (const Tensor& p : model.module()->parameters()) {
                final_params.push_back(p.detach().clone());
                Tensor theirs = p.detach().clone();
                pg.broadcast(theirs, {.root = 0})->wait();
                EXPECT(c, equal(theirs, p.detach()));
              }
              std::lock_guard lock(mu);
              run.grads[static_cast<size_t>(pg.rank())] = std::move(grads);
              run.final_params[static_cast<size_t>(pg.rank())] = std::move(final_params);
            },
            {.timeout = std::chrono::seconds(20)});
  return run;
}

bool all_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!allclose(a[k], b[k], 1e-9, 1e-12)) return false;
  return true;
}

const std::vector<std::vector<int>> kUneven{{3, 6, 4}, {0, 5, 3}};
}  // namespace

// A joined rank runs the hook on zeros like any other (as PyTorch's), feeding its error memory
// in: at full rank each rank's error is its input minus the average delivered, and these sum to
// zero over the ranks only while every rank feeds its own back. Then every iteration is exactly
// the gradient of the data seen, before and after ranks join.
TEST_CASE("PowerSGD at full rank inside a Join gives the gradients of the data seen",
          "[ddp][hooks][powersgd][join]") {
  for (const std::vector<int>& batches : kUneven)
    for (bool batched : {false, true}) {
      INFO("batches " << batches[0] << "," << batches[1] << "," << batches[2] << "; "
                      << (batched ? "batched" : "per tensor"));
      const DataSeen ref = data_seen(batches);
      const JoinRun run = train_powersgd_in_join(batches, batched);
      for (int r = 0; r < 3; ++r) {
        REQUIRE(run.grads[static_cast<size_t>(r)].size() == static_cast<size_t>(batches[r]));
        for (int i = 0; i < batches[r]; ++i) {
          INFO("rank " << r << ", iteration " << i);
          CHECK(all_close(run.grads[static_cast<size_t>(r)][static_cast<size_t>(i)],
                          ref.grads[static_cast<size_t>(i)]));
        }
        INFO("rank " << r << "'s final parameters");
        CHECK(all_close(run.final_params[static_cast<size_t>(r)], ref.final_params));
      }
    }
}
