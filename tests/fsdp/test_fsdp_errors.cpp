// What fully_shard refuses and how ranks fail, on 2 ranks as threads over Gloo: a module sharded
// twice, a parameter two units share, ranks whose models differ, ranks that call or reduce
// units in different orders (every rank fails, naming both units), HSDP replicas that disagree,
// a backward that throws or leaves weight gradients for later, a rank that stops early.
#include <catch2/catch.hpp>

#include <chrono>

#include "autograd/autograd.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/fsdp/fsdp_checks.h"
#include "tests/fsdp/fsdp_test_util.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::fsdp::testing::borrow;
using gw::fsdp::testing::Net;
using gw::fsdp::testing::throw_in_backward_of;

TEST_CASE("a backward that leaves weight gradients for later refuses a unit, which reduces them",
          "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    fsdp::fully_shard(net->a, borrow(pg));
    Generator gen(5);
    Tensor x = randn({2, 3, 6}, gen, kFloat64).requires_grad_();
    autograd::WeightGradients rest;
    EXPECT_THROWS(c, InvalidArgumentError,
                  autograd::backward_input({(*net->a)(x).sum()}, {x}, {}, rest),
                  "[backward_input] fsdp::PostBackward needs its weights' gradients");
    // The whole backward still runs, and reduces.
    (*net->a)(x).sum().backward();
    EXPECT(c, net->a->ln_1->parameters()[0].grad().defined());
  });
}

TEST_CASE("fully_shard refuses a module sharded twice and a parameter two units share", "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    fsdp::fully_shard(net->a, borrow(pg));
    EXPECT_THROWS(c, InvalidArgumentError, fsdp::fully_shard(net->a, borrow(pg)), "[fully_shard]",
                  "sharded already");
    // Refused on one rank only (rank 1 shards `a` again, rank 0 shards `b`): both fail at once,
    // rank 0 naming rank 1's reason, rather than rank 0 waiting in a collective rank 1 left.
    EXPECT_THROWS(c, InvalidArgumentError,
                  fsdp::fully_shard(pg.rank() == 0 ? net->b : net->a, borrow(pg)),
                  pg.rank() == 0 ? "[rank 1] [fully_shard]" : "[fully_shard]", "sharded already");
    // The head's weight is the embedding's: sharding the head alone leaves the embedding,
    // which the root would hold, reading a tensor another unit manages.
    fsdp::fully_shard(net->head, borrow(pg));
    EXPECT_THROWS(c, InvalidArgumentError, fsdp::fully_shard(net, borrow(pg)), "[fully_shard]",
                  "emb.weight", "belongs to another unit");

    // The root first, then a block it holds already: refused, not sharded twice.
    auto other = std::make_shared<Net>();
    fsdp::fully_shard(other, borrow(pg));
    EXPECT_THROWS(c, InvalidArgumentError, fsdp::fully_shard(other->b, borrow(pg)),
                  "belongs to another unit", "blocks before the root");
    // Shards converted after sharding would leave the gathers reading the old buffer.
    other->to(kFloat32);
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    EXPECT_THROWS(c, StateError, other->loss(x, y), "moved or converted");
  });
}

TEST_CASE("ranks that call units in different orders fail on every rank, naming both units",
          "[fsdp]") {
  // Data-dependent routing over three Linear(4, 4) units: their collectives are one size, and
  // without the tags each rank would compute with another unit's parameters.
  struct Routed : nn::Module {
    std::vector<std::shared_ptr<nn::Linear>> units;
    std::vector<int> route{0, 1, 2};  // the units called, in order
    bool detach_last = false;         // the last unit's output leaves the graph (no backward)
    Routed() : Module("Routed") {
      Generator gen(3);
      for (const char* name : {"a", "b", "c"})
        units.push_back(register_module(name, std::make_shared<nn::Linear>(4, 4, true, gen)));
      to(kFloat64);
    }
    Tensor forward(const Tensor& x) override {
      Tensor y = x, before_last = x;
      for (int i : route) {
        before_last = y;
        y = (*units[static_cast<size_t>(i)])(y);
      }
      return detach_last ? before_last + y.detach() : y;
    }
  };
  auto sharded = [](dist::ProcessGroupGloo& pg) {
    auto net = std::make_shared<Routed>();
    for (auto& unit : net->units) fsdp::fully_shard(unit, borrow(pg));
    fsdp::fully_shard(net, borrow(pg));
    return net;
  };
  const Tensor x = ones({2, 4}, kFloat64);
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    // From the first call: rank 1 calls b before a.
    auto net = sharded(pg);
    net->route = pg.rank() == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{1, 0, 2};
    EXPECT_THROWS(c, InvalidArgumentError, (*net)(x),
                  "[fully_shard] rank " + std::to_string(pg.rank()),
                  "rank 0 gathered unit 1 (Linear) for its forward",
                  "rank 1 gathered unit 2 (Linear) for its forward", "same order");
    // After the call order was recorded: rank 0 calls c alone, rank 1 a then c. The gathers
    // each rank started ahead in the recorded order (b, on rank 1) are compared before it goes
    // its own way, so both fail, rather than rank 1 waiting for a gather of c that rank 0,
    // failed already, never starts.
    net = sharded(pg);
    net->route = {0, 1, 2};
    (*net)(x).sum().backward();
    net->route = pg.rank() == 0 ? std::vector<int>{2} : std::vector<int>{0, 2};
    EXPECT_THROWS(c, InvalidArgumentError, (*net)(x), "[fully_shard]", "while rank", "same order");
    // Forgotten after the failure: the next calls record their order afresh and run, and an op
    // that saved a shard (a penalty on the parameters) still has it in backward: writing the
    // tags leaves the shards' version alone.
    net->route = {0, 1, 2};
    Tensor penalty = zeros({}, kFloat64);
    for (const Tensor& p : net->parameters()) penalty = penalty + (p * p).sum();
    ((*net)(x).sum() + penalty).backward();
    EXPECT(c, net->units[0]->parameters()[0].grad().defined());
    // The same calls on both ranks, but rank 1's backward skips c: the backward gathers and
    // reductions started in the recorded order go apart, and both ranks fail in backward;
    // the next step runs.
    net->detach_last = pg.rank() == 1;
    EXPECT_THROWS(c, InvalidArgumentError, (*net)(x).sum().backward(), "[fully_shard]",
                  "same order");
    net->detach_last = false;
    (*net)(x).sum().backward();
    for (const Tensor& p : net->parameters()) EXPECT(c, p.grad().defined());
  });
}

namespace {
// Two Linear(4, 4) branches of one input, summed; with detach_b, b's branch gets no gradient, so
// that backward reduces a first and b at the end, where the others reduce b first.
struct Branches : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  bool detach_b = false;
  Branches() : Module("Branches") {
    Generator gen(5);
    a = register_module("a", std::make_shared<nn::Linear>(4, 4, true, gen));
    b = register_module("b", std::make_shared<nn::Linear>(4, 4, true, gen));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    Tensor ya = (*a)(x), yb = (*b)(x);
    return ya + (detach_b ? yb.detach() : yb);
  }
};
}  // namespace

TEST_CASE("ranks that reduce units in different orders fail before any gradient lands", "[fsdp]") {
  // Two Linear(4, 4) branches called in one order on both ranks (the gathers agree), kept
  // gathered through backward (no backward gathers). Rank 0's backward reduces b first (its
  // nodes are the newer), then a; rank 1 detaches b's branch, so its backward reduces a, and b
  // at the end: without the reductions' tags, each unit's gradients would be averaged with the
  // other's.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Branches>();
    const fsdp::FullyShardOptions keep{.reshard_after_forward = false};
    fsdp::fully_shard(net->a, borrow(pg), keep);
    fsdp::fully_shard(net->b, borrow(pg), keep);
    fsdp::fully_shard(net, borrow(pg), keep);
    net->detach_b = pg.rank() == 1;
    const Tensor x = ones({2, 4}, kFloat64).requires_grad_();
    EXPECT_THROWS(c, InvalidArgumentError, (*net)(x).sum().backward(), "[fully_shard]",
                  "reduced unit", "for its gradients while rank");
    for (const Tensor& p : net->parameters()) EXPECT(c, !p.grad().defined());
    // Forgotten at the next call: the same step on both ranks runs, and gives every shard
    // its gradient.
    net->detach_b = false;
    (*net)(x).sum().backward();
    for (const Tensor& p : net->parameters()) EXPECT(c, p.grad().defined());
  });
}

TEST_CASE("HSDP replicas that reduce a unit a different number of times fail on every rank",
          "[fsdp]") {
  // Replica 1 calls block b once, replica 0 twice: b's reductions would pair with the next
  // unit's. Every rank finds it comparing the replicas' tags and counts, before any sum.
  auto store = std::make_shared<store::HashStore>();
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
    auto net = std::make_shared<Net>();
    net->b_calls = groups.replicate->rank() == 0 ? 2 : 1;
    fsdp::testing::shard(net, groups.shard, {.replicate_group = groups.replicate});
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    EXPECT_THROWS(c, InvalidArgumentError, net->loss(x, y).backward(),
                  "and another replica did otherwise");
    EXPECT(c, !net->b->parameters()[0].grad().defined());  // nothing reached a shard
  });
}

TEST_CASE("HSDP ranks that set set_requires_all_reduce otherwise fail on every rank", "[fsdp]") {
  // Replica 0 would sum its rows over the replicate group and replica 1 keep them: the sum
  // would pair with replica 1's next collective. Every rank finds it comparing the replicas.
  // Then the ranks of each shard group differ (place 0 keeps, place 1 sums): they find it
  // comparing their reductions' tags, and the replicas learn of it.
  for (bool within : {false, true}) {
    auto store = std::make_shared<store::HashStore>();
    run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
      auto net = std::make_shared<Net>();
      auto root = fsdp::testing::shard(net, groups.shard, {.replicate_group = groups.replicate});
      root->set_requires_all_reduce((within ? groups.shard : groups.replicate)->rank() == 1);
      auto [x, y] = fsdp::testing::batch(1, 0, 0);
      EXPECT_THROWS(c, InvalidArgumentError, net->loss(x, y).backward(),
                    within ? "kept in its replica" : "set_requires_all_reduce otherwise");
      for (const Tensor& p : net->parameters()) EXPECT(c, !p.grad().defined());
    });
  }
}

TEST_CASE(
    "HSDP: the ranks of one replica disagree, or the replicate group pairs other places: "
    "every rank fails",
    "[fsdp]") {
  // As above (ranks that reduce units in different orders), inside replica 1 only: its ranks
  // fail comparing their tags, and replica 0's ranks, which agree among themselves, fail
  // comparing theirs with replica 1's instead of waiting for it. Then replicate groups that
  // pair shard rank 0 of one replica with shard rank 1 of the other, which would sum other rows.
  for (bool crossed : {false, true}) {
    auto store = std::make_shared<store::HashStore>();
    run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      const auto groups = fsdp::testing::hsdp_groups(store, pg.rank(), crossed);
      auto net = std::make_shared<Branches>();
      const fsdp::FullyShardOptions keep{.reshard_after_forward = false,
                                         .replicate_group = groups.replicate};
      fsdp::fully_shard(net->a, groups.shard, keep);
      fsdp::fully_shard(net->b, groups.shard, keep);
      fsdp::fully_shard(net, groups.shard, keep);
      net->detach_b = !crossed && pg.rank() == 3;
      const Tensor x = ones({2, 4}, kFloat64).requires_grad_();
      if (!crossed && pg.rank() >= 2)  // replica 1
        EXPECT_THROWS(c, InvalidArgumentError, (*net)(x).sum().backward(), "reduced unit",
                      "for its gradients while rank");
      else
        EXPECT_THROWS(c, InvalidArgumentError, (*net)(x).sum().backward(),
                      "and another replica did otherwise");
      for (const Tensor& p : net->parameters()) EXPECT(c, !p.grad().defined());
    });
  }
}

TEST_CASE("fully_shard fails on every rank when the ranks' models differ", "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>(pg.rank() == 0 ? 6 : 4);
    EXPECT_THROWS(c, InvalidArgumentError, fsdp::fully_shard(net->a, borrow(pg)), "[fully_shard]",
                  "rank");
  });
}

TEST_CASE(
    "a backward that throws on every rank is forgotten: the next steps train as if it "
    "never ran",
    "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int r = pg.rank(), n = fsdp::testing::kPerRank;
    auto net = std::make_shared<Net>();
    auto reference = std::make_shared<Net>();
    fsdp::testing::shard(net, borrow(pg));
    const optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(net->parameters(), adamw), ref_opt(reference->parameters(), adamw);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = fsdp::testing::batch(2, step, 0);
      if (step == 1) {
        // The gradient reaching block a's output throws, after block b's reductions were issued
        // and the root's gradients were left on its members.
        const int64_t hook = throw_in_backward_of(*net->a);
        opt.zero_grad();
        EXPECT_THROWS(c, std::exception,
                      net->loss(x.narrow(0, r * n, n), y.narrow(0, r * n, n)).backward(),
                      "injected");
        net->a->remove_hook(hook);
      }
      opt.zero_grad();
      ref_opt.zero_grad();
      net->loss(x.narrow(0, r * n, n), y.narrow(0, r * n, n)).backward();
      reference->loss(x, y).backward();
      opt.step();
      ref_opt.step();
    }
    fsdp::testing::check_rows(c, *net, *reference, r, 2, "after a failed backward",
                              [](const Tensor& t) { return t; });
  });
}

TEST_CASE("HSDP: a failed backward forgets the sums kept without the sum over the replicas",
          "[fsdp]") {
  // A micro-batch kept in its replica (set_requires_all_reduce(false)), then a backward that
  // throws: the step is abandoned, and the next one trains as if neither had run.
  auto store = std::make_shared<store::HashStore>();
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
    const int n = fsdp::testing::kPerRank;  // this rank's rows: pg.rank()'s of 4
    auto net = std::make_shared<Net>();
    auto reference = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, groups.shard, {.replicate_group = groups.replicate});
    const optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(net->parameters(), adamw), ref_opt(reference->parameters(), adamw);
    auto [x, y] = fsdp::testing::batch(4, 0, 0);
    auto mine = [&, x = x, y = y] {
      return net->loss(x.narrow(0, pg.rank() * n, n), y.narrow(0, pg.rank() * n, n));
    };
    root->set_requires_all_reduce(false);
    mine().backward();
    const int64_t hook = throw_in_backward_of(*net->a);
    EXPECT_THROWS(c, std::exception, mine().backward(), "injected");
    net->a->remove_hook(hook);
    root->set_requires_all_reduce(true);
    opt.zero_grad();
    mine().backward();
    reference->loss(x, y).backward();
    opt.step();
    ref_opt.step();
    fsdp::testing::check_rows(c, *net, *reference, groups.shard->rank(), 2,
                              "after a failed backward", [](const Tensor& t) { return t; });
  });
}

TEST_CASE("a rank that stops early fails the other's next call within the group's timeout",
          "[fsdp]") {
  run_ranks(2,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              auto net = std::make_shared<Net>();
              fsdp::testing::shard(net, borrow(pg));
              if (pg.rank() == 1) return;  // stops: its group goes with it
              auto [x, y] = fsdp::testing::batch(1, 0, 0);
              const auto start = std::chrono::steady_clock::now();
              EXPECT_THROWS(c, std::exception, net->loss(x, y).backward(),
                            "[all_gather_into_tensor]", "rank 0 of 2");
              EXPECT(c, std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
            },
            {.timeout = std::chrono::seconds(5)});
}
