// DistributedDataParallel with ranks as threads: averaged gradients equal single-process
// gradients on the concatenated batch, replicas stay identical, and the Reducer's rules.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
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

// Rank r's rows of a global batch.
Tensor shard(const Tensor& t, int r) { return t.narrow(0, r * kShard, kShard); }

// The global batch of a step: every rank trains on rows [rank * kShard, (rank + 1) * kShard).
std::pair<Tensor, Tensor> batch(int world, int step) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  return {randn({world * kShard, 8}, gen), randint(0, 4, {world * kShard}, gen)};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

bool same_grads(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    if (!allclose(pa[i].grad(), pb[i].grad(), 1e-4, 1e-6)) return false;
  return true;
}
}  // namespace

TEST_CASE("DDP gradients equal single-process gradients on the concatenated batch", "[ddp]") {
  // Through shared memory, each .grad is averaged where it is (the buckets stay unused); over
  // TCP, through the buckets.
  const bool shm = GENERATE(true, false);
  for (int world : {2, 3})
    for (double cap_mb : {1e-4, 25.0}) {  // one bucket per parameter, or a single bucket
      INFO("world " << world << ", bucket cap " << cap_mb << " MB" << (shm ? ", shm" : ", TCP"));
      run_ranks(world,
                [&](dist::ProcessGroupGloo& pg, Checks& c) {
                  EXPECT(c, pg.coalesces_in_place() == shm);
                  // Different initial weights per rank: DDP must start every replica from rank 0's.
                  ddp::DistributedDataParallel model(
                      mlp(pg.rank() == 0 ? 7 : 100 + pg.rank()), borrow(pg),
                      {.bucket_cap_mb = cap_mb, .first_bucket_cap_mb = cap_mb});
                  auto reference = mlp(7);
                  optim::SGD opt(model.module()->parameters(), optim::SGD::options(0.1));
                  optim::SGD ref_opt(reference->parameters(), optim::SGD::options(0.1));
                  for (int step = 0; step < 3; ++step) {
                    auto [x, y] = batch(world, step);
                    opt.zero_grad();
                    ref_opt.zero_grad();
                    Tensor mine = shard(x, pg.rank());
                    Tensor my_y = shard(y, pg.rank());
                    nn::functional::cross_entropy(model.forward(mine), my_y).backward();
                    nn::functional::cross_entropy(reference->forward(x), y).backward();
                    EXPECT(c, same_grads(*model.module(), *reference));
                    opt.step();
                    ref_opt.step();
                  }
                  // The replicas trained in lockstep with the single-process model.
                  auto p = model.module()->parameters(), q = reference->parameters();
                  for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-4, 1e-6));
                  EXPECT(c, model.reducer().buckets().size() == (cap_mb < 1 ? 4u : 1u));
                  for (const auto& b : model.reducer().buckets())
                    EXPECT(c, b.flat.defined() != shm);
                },
                {.shared_memory = shm});
    }
}

TEST_CASE("communication starts before backward has finished", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(1), borrow(pg),
                                       {.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4});
    auto [x, y] = batch(2, 0);
    nn::functional::cross_entropy(model.forward(x), y).backward();
    // Four buckets, launched in index order as their gradients came: all but the last before
    // the last gradient of the pass was ready.
    EXPECT(c, model.reducer().launched() == 4);
    EXPECT(c, model.reducer().launched_before_last_ready() == 3);
  });
}

TEST_CASE("no_sync accumulates locally; the next synced backward averages the sum", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(3), borrow(pg));
    auto reference = mlp(3);
    auto [x1, y1] = batch(2, 1);
    auto [x2, y2] = batch(2, 2);
    {
      auto guard = model.no_sync();
      nn::functional::cross_entropy(model.forward(shard(x1, pg.rank())), shard(y1, pg.rank()))
          .backward();
      EXPECT(c, model.reducer().launched() == 0);
    }
    nn::functional::cross_entropy(model.forward(shard(x2, pg.rank())), shard(y2, pg.rank()))
        .backward();
    nn::functional::cross_entropy(reference->forward(x1), y1).backward();
    nn::functional::cross_entropy(reference->forward(x2), y2).backward();
    EXPECT(c, same_grads(*model.module(), *reference));
  });
}

TEST_CASE("a parameter without a gradient is reported by name at the next forward", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = mlp(4);
    ddp::DistributedDataParallel model(net, borrow(pg));
    auto [x, y] = batch(2, 0);
    // Only the first layer's output reaches the loss: "2.weight" and "2.bias" get no gradient.
    Tensor hidden = (*net)[0]->forward(x);
    hidden.sum().backward();
    EXPECT_THROWS(c, StateError, model.forward(x), "2.weight", "2.bias",
                  "finished reduction in the prior iteration");
  });
}

TEST_CASE("a destroyed DDP leaves its parameters without hooks", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = mlp(4);
    auto hooks_on = [&] {
      size_t n = 0;
      for (const Tensor& p : net->parameters())
        if (const auto* m = autograd::meta_if(p); m && m->post_accumulate_hooks)
          n += m->post_accumulate_hooks->size();
      return n;
    };
    auto [x, y] = batch(2, 0);
    {
      ddp::DistributedDataParallel model(net, borrow(pg));
      EXPECT(c, hooks_on() == net->parameters().size());
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
    }
    EXPECT(c, hooks_on() == 0);
    ddp::DistributedDataParallel again(net, borrow(pg));  // wrapping again: a fresh set
    EXPECT(c, hooks_on() == net->parameters().size());
  });
}

TEST_CASE("a parameter marked ready twice in one iteration is named", "[ddp][errors]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = mlp(4);
    ddp::DistributedDataParallel model(net, borrow(pg));
    auto [x, y] = batch(2, 0);
    // The first layer's gradients twice before the last layer's arrive: its hooks fire again
    // while the iteration still waits for "2.weight" and "2.bias".
    (*net)[0]->forward(x).sum().backward();
    EXPECT_THROWS(c, StateError, (*net)[0]->forward(x).sum().backward(), "0.",
                  "marked ready twice");
  });
}

TEST_CASE("DDP checks parameter shapes across ranks at construction", "[ddp][errors]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    Generator gen(0);
    auto net = std::make_shared<nn::Linear>(pg.rank() == 0 ? 3 : 4, 2, true, gen);
    EXPECT_THROWS(c, InvalidArgumentError, ddp::DistributedDataParallel(net, borrow(pg)),
                  "parameter weight", "(2, 3) float32", "(2, 4) float32");
  });
}

namespace {
// Two heads; forward uses the second one only when `both`: on the other ranks its parameters
// are unused.
struct TwoHeads : nn::Module {
  std::shared_ptr<nn::Linear> used, unused;
  bool both;
  TwoHeads(uint64_t seed, bool both) : Module("TwoHeads"), both(both) {
    Generator gen(seed);
    used = register_module("used", std::make_shared<nn::Linear>(8, 4, true, gen));
    unused = register_module("unused", std::make_shared<nn::Linear>(8, 4, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    return both ? used->forward(x) + unused->forward(x) : used->forward(x);
  }
};
}  // namespace

TEST_CASE("find_unused_parameters: a head unused on one rank is averaged with zeros there",
          "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    // Rank 1 uses both heads, rank 0 only the first.
    auto net = std::make_shared<TwoHeads>(5, pg.rank() == 1);
    ddp::DistributedDataParallel model(net, borrow(pg), {.find_unused_parameters = true});
    for (int step = 0; step < 2; ++step) {  // a second forward must not raise
      auto [x, y] = batch(2, step);
      net->zero_grad();
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
      // The second head's gradient: rank 1's, halved (rank 0 contributes zero).
      auto reference = std::make_shared<TwoHeads>(5, true);  // the same initial weights
      nn::functional::cross_entropy(reference->forward(shard(x, 1)), shard(y, 1)).backward();
      if (step == 0)
        EXPECT(c, allclose(net->unused->weight.grad(), reference->unused->weight.grad() * 0.5, 1e-4,
                           1e-6));
      EXPECT(c, net->unused->weight.grad().abs().sum().item<double>() > 0);
    }
  });
}

TEST_CASE("no_sync is decided by the forward pass, and guards nest", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(8), borrow(pg));
    auto [x, y] = batch(2, 0);
    Tensor mine = shard(x, pg.rank());
    Tensor my_y = shard(y, pg.rank());
    Tensor loss;
    {
      auto outer = model.no_sync();
      { auto inner = model.no_sync(); }
      // Still inside the outer guard after the inner one ended.
      loss = nn::functional::cross_entropy(model.forward(mine), my_y);
    }
    loss.backward();  // outside the guards, but its forward was inside: no reduction
    EXPECT(c, model.reducer().launched() == 0);
    nn::functional::cross_entropy(model.forward(mine), my_y).backward();
    EXPECT(c, model.reducer().launched() > 0);
  });
}

TEST_CASE("communication hooks: fp16 compression and a hook of one's own", "[ddp][hooks]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto [x, y] = batch(2, 3);
    Tensor mine = shard(x, pg.rank());
    Tensor my_y = shard(y, pg.rank());
    auto reference = mlp(6);
    nn::functional::cross_entropy(reference->forward(x), y).backward();

    ddp::DistributedDataParallel fp16(mlp(6), borrow(pg));
    fp16.register_comm_hook(ddp::hooks::fp16_compress());
    nn::functional::cross_entropy(fp16.forward(mine), my_y).backward();
    auto p = fp16.module()->parameters(), q = reference->parameters();
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT(c, allclose(p[i].grad(), q[i].grad(), 1e-2, 1e-3));  // float16 on the wire

    // A hook that does not communicate: each rank keeps its own local gradients, and the hook
    // sees every bucket once, in index order, the last one flagged.
    std::vector<size_t> seen;
    bool last_flagged = false;
    ddp::DistributedDataParallel local(mlp(6), borrow(pg),
                                       {.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4});
    local.register_comm_hook([&](dist::ProcessGroup&, ddp::GradBucket& b) {
      seen.push_back(b.index);
      last_flagged = b.is_last;
      return Future<Tensor>::ready(b.buffer);
    });
    auto solo = mlp(6);
    nn::functional::cross_entropy(local.forward(mine), my_y).backward();
    nn::functional::cross_entropy(solo->forward(mine), my_y).backward();
    EXPECT(c, same_grads(*local.module(), *solo));
    EXPECT(c, (seen == std::vector<size_t>{0, 1, 2, 3}));
    EXPECT(c, last_flagged);
    EXPECT_THROWS(c, StateError, local.register_comm_hook(ddp::hooks::allreduce()),
                  "before the first backward");
  });
}

namespace {
// Registered as (first, second) but applied second-then-first: backward makes `first`'s
// gradients ready before `second`'s, the opposite of the initial reverse-registration buckets.
struct Swapped : nn::Module {
  std::shared_ptr<nn::Linear> first, second;
  explicit Swapped(uint64_t seed) : Module("Swapped") {
    Generator gen(seed);
    first = register_module("first", std::make_shared<nn::Linear>(8, 4, true, gen));
    second = register_module("second", std::make_shared<nn::Linear>(8, 8, true, gen));
  }
  Tensor forward(const Tensor& x) override { return first->forward(second->forward(x).relu()); }
};
}  // namespace

TEST_CASE("buckets are rebuilt in the order gradients became ready", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Swapped>(9);
    ddp::DistributedDataParallel model(net, borrow(pg),
                                       {.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4});
    auto reference = std::make_shared<Swapped>(9);
    auto first_param = [&] { return model.reducer().buckets()[0].params[0]; };
    EXPECT(c, first_param() == 3u);  // second.bias: reverse registration order
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(2, step);
      net->zero_grad();
      reference->zero_grad();
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
      nn::functional::cross_entropy(reference->forward(x), y).backward();
      EXPECT(c, same_grads(*net, *reference));  // before and after the rebuild
    }
    EXPECT(c, first_param() < 2u);  // first.weight or first.bias: ready first in backward
    EXPECT(c, model.reducer().buckets().size() == 4u);
  });
}

TEST_CASE("gradient_as_bucket_view: .grad lives in the bucket and stays correct", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(
        mlp(4), borrow(pg),
        {.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4, .gradient_as_bucket_view = true});
    auto reference = mlp(4);
    optim::SGD opt(model.module()->parameters(), optim::SGD::options(0.1));
    optim::SGD ref_opt(reference->parameters(), optim::SGD::options(0.1));
    for (int step = 0; step < 3; ++step) {  // across the bucket rebuild after step 0
      auto [x, y] = batch(2, step);
      opt.zero_grad();
      ref_opt.zero_grad();
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
      nn::functional::cross_entropy(reference->forward(x), y).backward();
      EXPECT(c, same_grads(*model.module(), *reference));
      const auto params = model.module()->parameters();
      for (const auto& b : model.reducer().buckets())
        for (size_t i : b.params) EXPECT(c, params[i].grad().storage() == b.flat.storage());
      opt.step();
      ref_opt.step();
    }
  });
}

TEST_CASE("a .grad that is not contiguous is averaged and stays the same tensor", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(4), borrow(pg));
    auto reference = mlp(4);
    Tensor weight = model.module()->parameters()[0];  // 16 x 8
    Tensor strided = zeros({8, 16}).t();              // backward accumulates into it
    weight.set_grad(strided);
    auto [x, y] = batch(2, 0);
    nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
        .backward();
    nn::functional::cross_entropy(reference->forward(x), y).backward();
    EXPECT(c, same_grads(*model.module(), *reference));
    EXPECT(c, weight.grad().storage() == strided.storage() && !weight.grad().is_contiguous());
  });
}

TEST_CASE("find_unused_parameters: a head no rank uses keeps no gradient", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<TwoHeads>(5, false);  // the second head is unused everywhere
    ddp::DistributedDataParallel model(net, borrow(pg), {.find_unused_parameters = true});
    auto reference = std::make_shared<TwoHeads>(5, false);
    auto [x, y] = batch(2, 0);
    nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
        .backward();
    nn::functional::cross_entropy(reference->forward(x), y).backward();
    EXPECT(c, !net->unused->weight.grad().defined());
    EXPECT(c, !net->unused->bias.grad().defined());
    EXPECT(c, allclose(net->used->weight.grad(), reference->used->weight.grad(), 1e-4, 1e-6));
  });
}

TEST_CASE("find_unused_parameters: gradients of no_sync steps are averaged at the sync", "[ddp]") {
  run_ranks(2, [](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<TwoHeads>(5, true);
    ddp::DistributedDataParallel model(net, borrow(pg), {.find_unused_parameters = true});
    auto [x, y] = batch(2, 0);
    {
      auto guard = model.no_sync();  // both heads get local gradients
      nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
          .backward();
    }
    net->both = false;  // the synced step does not use the second head on any rank
    nn::functional::cross_entropy(model.forward(shard(x, pg.rank())), shard(y, pg.rank()))
        .backward();
    auto reference = std::make_shared<TwoHeads>(5, true);
    for (int r = 0; r < 2; ++r)
      nn::functional::cross_entropy(reference->forward(shard(x, r)), shard(y, r)).backward();
    EXPECT(c, allclose(net->unused->weight.grad(), reference->unused->weight.grad() * 0.5, 1e-4,
                       1e-6));
  });
}

namespace {
// Adds a buffer to its input: the buffer's value is visible in the output.
struct Shifted : nn::Module {
  Tensor shift;
  explicit Shifted(float value) : Module("Shifted") {
    shift = register_buffer("shift", full({4}, value));
    lin = register_module("lin", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor forward(const Tensor& x) override { return lin->forward(x + shift); }
  std::shared_ptr<nn::Linear> lin;
};
}  // namespace

TEST_CASE("broadcast_buffers: rank 0's buffers reach every rank before each forward", "[ddp]") {
  for (bool broadcast : {true, false}) {
    INFO("broadcast_buffers " << broadcast);
    run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      auto net = std::make_shared<Shifted>(0.0f);
      ddp::DistributedDataParallel model(net, borrow(pg), {.broadcast_buffers = broadcast});
      {
        autograd::NoGradGuard no_grad;
        net->shift.fill_(static_cast<double>(pg.rank() + 1));  // e.g. running statistics
      }
      model.forward(ones({2, 4}));
      const double expected = broadcast ? 1.0 : pg.rank() + 1.0;
      EXPECT(c, allclose(net->shift, full({4}, expected)));
    });
  }
}

namespace {
// Two float buffers (broadcast as one buffer), one of them saved for backward by a product.
struct Masked : nn::Module {
  Tensor scale, mask;
  Masked() : Module("Masked") {
    scale = register_buffer("scale", full({4}, 1.0));
    mask = register_buffer("mask", full({4}, 1.0));
    lin = register_module("lin", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor forward(const Tensor& x) override { return lin->forward(x * mask) * scale; }
  std::shared_ptr<nn::Linear> lin;
};
}  // namespace

TEST_CASE("buffers broadcast before a second forward stay valid for the first's backward",
          "[ddp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Masked>();
    ddp::DistributedDataParallel model(net, borrow(pg));
    {
      autograd::NoGradGuard no_grad;
      net->mask.fill_(static_cast<double>(pg.rank() + 2));
      net->scale.fill_(static_cast<double>(pg.rank() + 3));
    }
    // The second forward's broadcast rewrites `mask`, which the first saved: written as a
    // broadcast in place (no version bump), backward still runs.
    Tensor loss = model.forward(ones({2, 4})).sum() + model.forward(ones({2, 4})).sum();
    EXPECT(c, allclose(net->mask, full({4}, 2.0)) && allclose(net->scale, full({4}, 3.0)));
    loss.backward();
    EXPECT(c, net->lin->weight.grad().defined());
  });
}

TEST_CASE("a rank that leaves or stalls makes backward raise on the others", "[ddp][errors]") {
  using namespace std::chrono_literals;
  SECTION("it leaves: IoError at once") {
    run_ranks(2,
              [](dist::ProcessGroupGloo& pg, Checks& c) {
                ddp::DistributedDataParallel model(mlp(2), borrow(pg));
                if (pg.rank() == 1) return;  // its group closes its connections
                auto [x, y] = batch(2, 0);
                Tensor loss = nn::functional::cross_entropy(model.forward(x), y);
                const auto started = std::chrono::steady_clock::now();
                EXPECT_THROWS(c, IoError, loss.backward(), "allreduce");  // not the TimeoutError
                EXPECT(c, std::chrono::steady_clock::now() - started < 20s);
              },
              {.timeout = 30s});
  }
  SECTION("it stalls: TimeoutError within the group's timeout") {
    std::promise<void> failed;
    std::shared_future<void> rank0_failed = failed.get_future().share();
    struct Release {  // rank 1 leaves once rank 0 is done, however rank 0 ends
      std::promise<void>& done;
      ~Release() { done.set_value(); }
    };
    run_ranks(2,
              [&](dist::ProcessGroupGloo& pg, Checks& c) {
                if (pg.rank() == 1) {  // alive, but never runs backward
                  ddp::DistributedDataParallel model(mlp(2), borrow(pg));
                  EXPECT(c, rank0_failed.wait_for(120s) == std::future_status::ready);
                  return;
                }
                Release release{failed};
                ddp::DistributedDataParallel model(mlp(2), borrow(pg));
                auto [x, y] = batch(2, 0);
                Tensor loss = nn::functional::cross_entropy(model.forward(x), y);
                EXPECT_THROWS(c, TimeoutError, loss.backward(), "timed out");
              },
              {.timeout = 3s});
  }
}
