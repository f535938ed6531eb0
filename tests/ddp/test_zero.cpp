// ZeroRedundancyOptimizer with DDP, ranks as threads over real Gloo: the parameters follow the
// unsharded optimizer step for step, each rank holds 1/world of the state (measured), and the
// consolidated state is the plain optimizer's and loads at another world size. At world size 1 it
// is the plain optimizer; a rank whose range is empty steps, holds nothing, and takes part in
// consolidation and in distributed checkpoints saved and loaded at other world sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <mutex>

#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/optim/zero_redundancy_optimizer.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/factory.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/temp_dir.h"

using namespace gw;
namespace dcp = gw::dist::checkpoint;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;

namespace {
constexpr int64_t kShard = 4;  // samples per rank

std::shared_ptr<nn::Sequential> mlp() {
  Generator gen(11);
  return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 16, true, gen),
                                          std::make_shared<nn::ReLU>(),
                                          std::make_shared<nn::Linear>(16, 4, true, gen));
}

// The batch of a step for `world` ranks; rank r trains on rows [r * kShard, (r + 1) * kShard).
std::pair<Tensor, Tensor> batch(int world, int step) {
  Generator gen(3000 + static_cast<uint64_t>(step));
  return {randn({world * kShard, 8}, gen), randint(0, 4, {world * kShard}, gen)};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

const optim::OptimizerOptions kAdam = optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1};

int64_t state_bytes(const NamedTensors& state) {
  int64_t bytes = 0;
  for (const auto& [key, t] : state)
    if (key != "lr") bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// Trains steps [from, to) of DDP + ZeRO beside the single-process model and optimizer (which
// see the whole batch), checking the parameters after each step.
void train(dist::ProcessGroupGloo& pg, Checks& c, ddp::DistributedDataParallel& model,
           dist::ZeroRedundancyOptimizer& opt, nn::Module& reference, optim::Optimizer& ref_opt,
           int from, int to) {
  const int world = pg.size(), r = pg.rank();
  for (int step = from; step < to; ++step) {
    auto [x, y] = batch(world, step);
    opt.zero_grad();
    ref_opt.zero_grad();
    nn::functional::cross_entropy(model.forward(x.narrow(0, r * kShard, kShard)),
                                  y.narrow(0, r * kShard, kShard))
        .backward();
    opt.step();
    nn::functional::cross_entropy(reference.forward(x), y).backward();
    ref_opt.step();
    auto p = model.module()->parameters(), q = reference.parameters();
    for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-5, 1e-6));
  }
}
}  // namespace

TEST_CASE("ZeRO with DDP steps like the unsharded optimizer, on 1/world of the state",
          "[ddp][zero]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    int64_t whole = 0;
    std::vector<int64_t> per_rank(static_cast<size_t>(world));
    std::mutex mu;
    run_ranks(world, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      ddp::DistributedDataParallel model(mlp(), borrow(pg));
      dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
      auto reference = mlp();
      auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
      train(pg, c, model, opt, *reference, *ref_opt, 0, 4);
      // Ranges of ceil(212 / world) elements cut parameters in pieces; every piece is someone's.
      EXPECT(c, opt.pieces().size() > model.module()->parameters().size());
      std::lock_guard lock(mu);
      per_rank[static_cast<size_t>(pg.rank())] = opt.state_bytes();
      whole = state_bytes(ref_opt->state_dict());
    });
    // Adam keeps two float32 tensors per element, and a float32 step count per piece.
    int64_t sum = 0;
    for (int64_t b : per_rank) sum += b;
    const int64_t range = (212 + world - 1) / world;
    CHECK(sum >= whole);  // every element's moments somewhere; counts per piece
    CHECK(sum - whole < 4 * 4 * world);
    for (int64_t b : per_rank) {
      INFO("rank's state: " << b << " bytes of " << whole);
      CHECK(b <= range * 2 * 4 + 4 * 4);  // its range's moments and a few counts
      CHECK(b >= (212 - range * (world - 1)) * 2 * 4);
    }
  }
}

TEST_CASE("ZeRO's consolidated state is the plain optimizer's, and loads at another world size",
          "[ddp][zero]") {
  NamedTensors saved;  // rank 0's, after 3 steps at world 2
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(), borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    auto reference = mlp();
    auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
    train(pg, c, model, opt, *reference, *ref_opt, 0, 3);
    opt.consolidate_state_dict(0);
    if (pg.rank() == 0) {
      const NamedTensors mine = opt.state_dict(), theirs = ref_opt->state_dict();
      EXPECT(c, mine.size() == theirs.size());
      for (const auto& [key, t] : theirs)
        EXPECT(c, mine.contains(key) && allclose(mine.at(key), t, 1e-5, 1e-7));
      std::lock_guard lock(mu);
      saved = mine;
    } else {
      EXPECT_THROWS(c, StateError, opt.state_dict(), "no consolidated state on rank 1");
    }
  });
  REQUIRE(saved.size() == 1 + 4 * 3);  // lr, and step, exp_avg, exp_avg_sq of 4 parameters

  // At world 3 the same data is cut in 3 shards; from the saved state (and the parameters
  // reached at step 3, set below), training goes on as the plain optimizer would.
  run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto reference = mlp();
    auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
    auto start = mlp();
    // The parameters after step 3 of world 2: a plain run of those 3 steps.
    {
      auto replay = optim::make_optimizer(start->parameters(), kAdam);
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = batch(2, step);
        replay->zero_grad();
        nn::functional::cross_entropy(start->forward(x), y).backward();
        replay->step();
      }
      auto s = start->parameters(), q = reference->parameters();
      for (size_t i = 0; i < s.size(); ++i) {
        autograd::NoGradGuard no_grad;
        q[i].copy_(s[i]);
      }
      ref_opt->load_state_dict(saved);
    }
    ddp::DistributedDataParallel model(start, borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    opt.load_state_dict(saved);
    train(pg, c, model, opt, *reference, *ref_opt, 3, 6);
  });
}

TEST_CASE("ZeRO refuses parameters that differ across ranks, on every rank", "[ddp][zero]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    Tensor a = zeros({4, 2}).requires_grad_(), b = zeros({pg.rank() == 0 ? 3 : 5}).requires_grad_();
    EXPECT_THROWS(c, InvalidArgumentError, dist::ZeroRedundancyOptimizer({a, b}, kAdam, borrow(pg)),
                  "parameter 1 is (3) float32 on rank 0 but (5) float32 on rank 1");
  });
}

TEST_CASE("ZeRO at world size 1 steps like the plain optimizer and holds the whole state",
          "[ddp][zero]") {
  run_ranks(1, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(), borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    auto reference = mlp();
    auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
    // One range of all 212 elements: every parameter is one piece, whole, rank 0's.
    const auto params = model.module()->parameters();
    EXPECT(c, opt.pieces().size() == params.size());
    for (size_t k = 0; k < opt.pieces().size(); ++k) {
      const auto& piece = opt.pieces()[k];
      EXPECT(c, piece.param == k && piece.offset == 0 && piece.length == params[k].numel() &&
                    piece.owner == 0);
    }
    train(pg, c, model, opt, *reference, *ref_opt, 0, 4);
    // The same arithmetic on the same numbers: the parameters are the plain optimizer's exactly.
    auto q = reference->parameters();
    for (size_t i = 0; i < params.size(); ++i) EXPECT(c, equal(params[i], q[i]));
    // The whole state: two moments per element and a step count per parameter.
    const int64_t whole = state_bytes(ref_opt->state_dict());
    EXPECT(c, opt.state_bytes() == whole);
    EXPECT(c, whole == 212 * 2 * 4 + 4 * 4);
    opt.consolidate_state_dict(0);
    const NamedTensors mine = opt.state_dict(), theirs = ref_opt->state_dict();
    EXPECT(c, mine.size() == theirs.size());
    for (const auto& [key, t] : theirs) EXPECT(c, mine.contains(key) && equal(mine.at(key), t));
  });
}

namespace {
// A model of 4 elements (a 1 x 3 weight and a bias): at world 3 the ranges of ceil(4 / 3) = 2
// are rank 0's and rank 1's, and rank 2 owns nothing.
constexpr int64_t kTinyRows = 60;  // samples per step: divisible by every world size used
constexpr int kTinySteps = 6, kTinySavedAt = 3;

std::shared_ptr<nn::Linear> tiny(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Linear>(3, 1, true, gen);
}

std::pair<Tensor, Tensor> tiny_batch(int step) {
  Generator gen(4000 + static_cast<uint64_t>(step));
  return {randn({kTinyRows, 3}, gen), randn({kTinyRows, 1}, gen)};
}

// Steps [from, to) of DDP + ZeRO on the tiny model beside the plain model and optimizer (which
// see the whole batch), checking the parameters after each step.
void train_tiny(dist::ProcessGroupGloo& pg, Checks& c, ddp::DistributedDataParallel& model,
                dist::ZeroRedundancyOptimizer& opt, nn::Module& reference,
                optim::Optimizer& ref_opt, int from, int to) {
  const int64_t rows = kTinyRows / pg.size();
  for (int step = from; step < to; ++step) {
    auto [x, y] = tiny_batch(step);
    opt.zero_grad();
    ref_opt.zero_grad();
    nn::functional::mse_loss(model.forward(x.narrow(0, pg.rank() * rows, rows)),
                             y.narrow(0, pg.rank() * rows, rows))
        .backward();
    opt.step();
    nn::functional::mse_loss(reference.forward(x), y).backward();
    ref_opt.step();
    auto p = model.module()->parameters(), q = reference.parameters();
    for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-5, 1e-6));
  }
}

// The uninterrupted run: one process, the whole batch, the plain optimizer.
struct TinyReference {
  std::shared_ptr<nn::Linear> model = tiny(21);
  std::unique_ptr<optim::Optimizer> opt = optim::make_optimizer(model->parameters(), kAdam);
  NamedTensors state_at_save;  // the optimizer's, after kTinySavedAt steps
  TinyReference() {
    for (int step = 0; step < kTinySteps; ++step) {
      if (step == kTinySavedAt) state_at_save = opt->state_dict();
      auto [x, y] = tiny_batch(step);
      opt->zero_grad();
      nn::functional::mse_loss(model->forward(x), y).backward();
      opt->step();
    }
  }
};
}  // namespace

TEST_CASE(
    "ZeRO with a rank that owns no piece: it steps, holds nothing, consolidates, and "
    "its distributed checkpoint loads at other world sizes",
    "[ddp][zero][dist_checkpoint]") {
  const TinyReference uninterrupted;
  test::TempDir dir("gw_zero");
  run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(tiny(21), borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    // The weight's elements 0..1 are rank 0's; its element 2 and the bias rank 1's.
    const auto& pieces = opt.pieces();
    EXPECT(c, pieces.size() == 3);
    EXPECT(c, pieces[0].param == 0 && pieces[0].offset == 0 && pieces[0].length == 2 &&
                  pieces[0].owner == 0);
    EXPECT(c, pieces[1].param == 0 && pieces[1].offset == 2 && pieces[1].length == 1 &&
                  pieces[1].owner == 1);
    EXPECT(c, pieces[2].param == 1 && pieces[2].length == 1 && pieces[2].owner == 1);
    auto reference = tiny(21);
    auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
    // Every rank, rank 2 too, ends each step with the plain optimizer's parameters.
    train_tiny(pg, c, model, opt, *reference, *ref_opt, 0, kTinySavedAt);
    EXPECT(c, (opt.state_bytes() == 0) == (pg.rank() == 2));
    EXPECT(c, pg.rank() == 2 || opt.state_bytes() >= 2 * 2 * 4);  // at least two moments

    // Consolidated on the rank that holds nothing, and on another.
    for (int to : {2, 0}) {
      opt.consolidate_state_dict(to);
      if (pg.rank() == to) {
        const NamedTensors mine = opt.state_dict(), theirs = ref_opt->state_dict();
        EXPECT(c, mine.size() == theirs.size());
        for (const auto& [key, t] : theirs)
          EXPECT(c, mine.contains(key) && allclose(mine.at(key), t, 1e-5, 1e-7));
      } else {
        EXPECT_THROWS(c, StateError, opt.state_dict(), "no consolidated state on rank");
      }
    }

    // Rank 2 writes no moments: only the learning rate (and its share of the model's replicas).
    const dcp::ShardedState shards = opt.sharded_state_dict("optim.");
    EXPECT(c, shards.contains("optim.lr"));
    EXPECT(c, (shards.size() == 1) == (pg.rank() == 2));
    dcp::ShardedState state = dcp::whole(model.module()->state_dict(), "model.");
    state.merge(dcp::ShardedState(shards));
    dcp::save(dir.path, state, pg, {{"step", std::to_string(kTinySavedAt)}});
  });

  // The checkpoint holds the plain optimizer's state at the step it was saved.
  const dcp::Reader ckpt(dir.path);
  CHECK(ckpt.world_size() == 3);
  const NamedTensors saved = ckpt.read_all("optim.");
  REQUIRE(saved.size() == uninterrupted.state_at_save.size());  // lr, and 3 entries for 2 params
  for (const auto& [key, t] : uninterrupted.state_at_save) {
    INFO(key);
    REQUIRE(saved.contains(key));
    CHECK(allclose(saved.at(key), t, 1e-5, 1e-7));
  }

  // At world 1 (the whole state on one rank), 2 (every rank owns a range) and 5 (ranges of one
  // element: rank 4 owns nothing), from other weights: training goes on as if uninterrupted.
  for (int world : {1, 2, 5}) {
    INFO("loaded at world " << world);
    run_ranks(world, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      ddp::DistributedDataParallel model(tiny(100 + static_cast<uint64_t>(pg.rank())), borrow(pg));
      dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
      const dcp::Reader reader(dir.path);
      dcp::load(reader, dcp::whole(model.module()->state_dict(), "model."), pg);
      opt.load_state_dict(reader, "optim.");
      const bool owns = std::any_of(opt.pieces().begin(), opt.pieces().end(),
                                    [&](const auto& piece) { return piece.owner == pg.rank(); });
      EXPECT(c, owns == (world < 5 || pg.rank() < 4));
      EXPECT(c, (opt.state_bytes() > 0) == owns);
      // The plain optimizer resumed from the same checkpoint, beside it.
      auto reference = tiny(200);
      reference->load_state_dict(reader.read_all("model."));
      auto ref_opt = optim::make_optimizer(reference->parameters(), kAdam);
      ref_opt->load_state_dict(reader.read_all("optim."));
      train_tiny(pg, c, model, opt, *reference, *ref_opt, kTinySavedAt, kTinySteps);
      auto p = model.module()->parameters(), q = uninterrupted.model->parameters();
      for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-5, 1e-6));
    });
  }
}
