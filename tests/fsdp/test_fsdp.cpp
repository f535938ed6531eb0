// fully_shard on 2 and 4 ranks: threads over real Gloo here, processes under OpenMPI's mpirun
// (fsdp_probe). After 20 AdamW steps the shards equal single-process training on the global
// batch (fsdp_checks.h), with and without resharding after forward, with gradient accumulation,
// CPU offload (on NCCL at world size 1 where there is a GPU) and activation checkpointing;
// backward driven by autograd::grad, and around autograd nodes with two outputs; clipping under
// HSDP. Mixed precision and ShardedGradScaler: test_fsdp_mixed_precision.cpp; checkpoints:
// test_fsdp_checkpoint.cpp; what fully_shard refuses and how ranks fail: test_fsdp_errors.cpp.
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "autograd/autograd.h"
#include "dist/process_group/init_process_group.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/fsdp/fsdp_checks.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/mpirun.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::fsdp::testing::borrow;
using gw::fsdp::testing::collectives_during;
using gw::fsdp::testing::gathers_during;
using gw::fsdp::testing::Net;

TEST_CASE(
    "HSDP with set_requires_all_reduce(false) reduce-scatters each micro-batch and sums over the "
    "replicas only when set back",
    "[fsdp]") {
  // Each backward reduce-scatters every unit in its shard group, and the replicas compare it in
  // one small all-reduce a unit; the rows and counts of each reduction go over the replicate
  // group only with all_reduce on, and only then do the shards get a .grad.
  auto store = std::make_shared<store::HashStore>();
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, groups.shard, {.replicate_group = groups.replicate});
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    auto backward = [&] { net->loss(x, y).backward(); };
    root->set_requires_all_reduce(false);
    const auto kept = collectives_during(pg, backward);
    for (const Tensor& p : net->parameters()) EXPECT(c, !p.grad().defined());
    root->set_requires_all_reduce(true);
    const auto summed = collectives_during(pg, backward);
    EXPECT(c, net->emb->parameters()[0].grad().defined());
    // 3 units (a, b, the root) on 4 ranks, b called twice: 4 reductions a rank
    EXPECT(c, kept.at("reduce_scatter_tensor") == 4 * 4);
    EXPECT(c, summed.at("reduce_scatter_tensor") == 4 * 4);
    EXPECT(c, kept.at("allreduce") == 3 * 4);            // the comparisons alone
    EXPECT(c, summed.at("allreduce") == 3 * 4 + 4 * 4);  // and every reduction's rows
  });
}

TEST_CASE("fully_shard trains like one process on the global batch, on 2 and 4 Gloo ranks",
          "[fsdp]") {
  // With a CPU group, a CPUOffloadPolicy leaves the shards where they are: it changes nothing.
  const std::vector<fsdp::testing::Case> cases{
      {},
      {.options = {.reshard_after_forward = false}},
      {.options = {}, .micro_batches = 2, .steps = 10},
      {.options = {.offload_policy = fsdp::CPUOffloadPolicy{}}, .steps = 5},
      {.options = {}, .steps = 10, .checkpoint = true},
      // gathered again after each optimizer step only because the shards changed
      {.options = {.reshard_after_forward = false},
       .micro_batches = 3,
       .steps = 5,
       .keep_gathered = true}};
  for (int world : {2, 4})
    run_ranks(world, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      for (const auto& k : cases) fsdp::testing::check_matches_single_process(borrow(pg), c, k);
    });
}

TEST_CASE("HSDP: sharded within pairs of ranks and replicated across them, trains like one process",
          "[fsdp]") {
  // 4 ranks as FSDP2's 2-D mesh (replicate, shard) of {2, 2}: each pair shards the model, and
  // the reductions are summed over the pairs, so every shard takes the average over all 4
  // ranks' rows of the batch: with and without resharding, accumulating without sync or without
  // the sum over the replicas, offloaded, checkpointed, and in bfloat16 over float32 shards.
  auto store = std::make_shared<store::HashStore>();
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
    const fsdp::FullyShardOptions hsdp{.replicate_group = groups.replicate};
    fsdp::FullyShardOptions kept = hsdp, offloaded = hsdp, mixed = hsdp;
    kept.reshard_after_forward = false;
    offloaded.offload_policy = fsdp::CPUOffloadPolicy{};
    mixed.mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32};
    for (const fsdp::testing::Case& k :
         {fsdp::testing::Case{.options = hsdp}, fsdp::testing::Case{.options = kept},
          // accumulated without sync, then summed over the shards and the replicas at once
          fsdp::testing::Case{.options = hsdp, .micro_batches = 2, .steps = 10},
          // reduce-scattered each micro-batch, summed over the replicas at the last
          fsdp::testing::Case{
              .options = hsdp, .micro_batches = 3, .all_reduce_last = true, .steps = 5},
          fsdp::testing::Case{.options = mixed,
          .micro_batches = 3,
          .all_reduce_last = true,
          .steps = 5,
          .tolerance = 5e-2,
          .dtype = kFloat32},
          fsdp::testing::Case{.options = offloaded, .steps = 5},
          fsdp::testing::Case{.options = hsdp, .steps = 10, .checkpoint = true},
          // the bound of the bfloat16 test below
          fsdp::testing::Case{.options = mixed, .tolerance = 5e-2, .dtype = kFloat32}})
      fsdp::testing::check_matches_single_process(groups.shard, c, k);
  });
}

TEST_CASE(
    "fully_shard over NCCL at world size 1 trains as one process, shards on the GPU or offloaded",
    "[fsdp][nccl]") {
  std::string why;
  if (!dist::nccl_available(&why)) GW_SKIP(why);
  auto pg = dist::init_process_group("nccl", std::make_shared<store::HashStore>(), 0, 1);
  struct Destroy {
    ~Destroy() { dist::destroy_process_group(); }
  } destroy;
  Checks c;
  // The GPU sums float64 in another order than the CPU: 5 AdamW steps stay within 1e-9.
  for (bool offload : {false, true}) {
    fsdp::testing::Case k{.options = {}, .steps = 5, .tolerance = 1e-9, .device = pg->device()};
    if (offload) k.options.offload_policy = fsdp::CPUOffloadPolicy{};
    fsdp::testing::check_matches_single_process(pg, c, k);
  }
  dist::testing::require_passed(c);
}

TEST_CASE("a unit under an activation checkpoint gathers once for its recomputation and backward",
          "[fsdp]") {
  // The blocks' calls under autograd::checkpoint (trained like one process: the first test):
  // the recomputation inside backward gathers as the unit's backward does and keeps the
  // parameters for it, so that a step gathers each unit as often as without checkpointing:
  // once per call in forward, once per call in backward. Counted in the flight recorder,
  // which both ranks' threads share, between barriers.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto gathers_in_a_step = [&](bool checkpoint) {
      auto net = std::make_shared<Net>();
      net->checkpoint_blocks = checkpoint;
      fsdp::testing::shard(net, borrow(pg));
      auto [x, y] = fsdp::testing::batch(1, 0, 0);
      net->loss(x, y).backward();  // the first step records the orders the next prefetches in
      return gathers_during(pg, [&] { net->loss(x, y).backward(); });
    };
    // Per rank: the root once, block a once and b twice in each direction.
    EXPECT(c, gathers_in_a_step(false) == 2 * 7);
    EXPECT(c, gathers_in_a_step(true) == 2 * 7);
  });
}

TEST_CASE(
    "autograd::grad through resharded units gathers them for its backward: the unsharded "
    "model's gradient, and no shard's .grad",
    "[fsdp]") {
  // autograd::grad returns d(loss)/d(inputs) instead of accumulating into .grad. The blocks
  // (resharded after their forward) are on the way from the loss to the embedding's output, so
  // their pre-backward hooks must gather them as for backward(); their reductions then find no
  // gradient, and no shard gets a .grad (FSDP2 leaves them alike). The first pass records the
  // backward order; the second, with the graph kept, prefetches in it and is followed by
  // backward(), which gives the shards the unsharded model's gradients. The shards themselves
  // are not in the graph (the gathered members are): autograd::grad refuses them as it refuses
  // any tensor the outputs do not use, as torch.autograd.grad does FSDP2's sharded parameters.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int64_t n = fsdp::testing::kPerRank;
    auto net = std::make_shared<Net>(), reference = std::make_shared<Net>();
    fsdp::testing::shard(net, borrow(pg));
    // Each model's embedding output (block a's input), what the gradient is taken by.
    Tensor embedded, ref_embedded;
    net->emb->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
      embedded = out;
      return Tensor();
    });
    reference->emb->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
      ref_embedded = out;
      return Tensor();
    });
    auto [x, y] = fsdp::testing::batch(2, 0, 0);
    const Tensor mine_x = x.narrow(0, pg.rank() * n, n), mine_y = y.narrow(0, pg.rank() * n, n);
    auto no_shard_has_grad = [&] {
      for (const Tensor& p : net->parameters())
        if (p.grad().defined()) return false;
      return true;
    };
    for (int pass = 0; pass < 2; ++pass) {
      const bool then_backward = pass == 1;
      const Tensor loss = net->loss(mine_x, mine_y);
      const Tensor got = autograd::grad({loss}, {embedded},
                                        {.grad_outputs = {}, .retain_graph = then_backward})[0];
      const Tensor ref_loss = reference->loss(mine_x, mine_y);  // sets ref_embedded
      const Tensor want = autograd::grad({ref_loss}, {ref_embedded})[0];
      c.expect(got.sizes() == want.sizes() && allclose(got, want, 1e-12, 1e-12),
               gw::detail::str("rank ", pg.rank(), ", pass ", pass,
                               ": autograd::grad by the embedding's output equals the unsharded "
                               "model's"));
      EXPECT(c, no_shard_has_grad());
      if (!then_backward) continue;
      loss.backward();  // the same graph: every unit gathered again for it
      reference->zero_grad();
      reference->loss(x, y).backward();
      fsdp::testing::check_rows(
          c, *net, *reference, pg.rank(), 2, "backward after autograd::grad",
          [](const Tensor& t) { return t.grad().defined() ? t.grad() : t * 0; });
      EXPECT(c, net->a->parameters()[0].grad().defined());
    }
    net->zero_grad();
    EXPECT_THROWS(c, InvalidArgumentError,
                  autograd::grad({net->loss(mine_x, mine_y)}, net->parameters()),
                  "[grad] input 0 was not used");
    EXPECT(c, no_shard_has_grad());
  });
}

namespace {

// A unit whose output is the second output of a two-output node: the unit runs its layer in a
// checkpointed segment that returns two tensors and returns the second, the first unused. Its
// pre-backward hook sits on that node's second input; the first gets no gradient.
struct SecondOfTwo : nn::Module {
  std::shared_ptr<nn::Linear> lin;
  explicit SecondOfTwo(Generator& gen) : Module("SecondOfTwo") {
    lin = register_module("lin", std::make_shared<nn::Linear>(4, 4, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    return autograd::checkpoint(
        [this](const std::vector<Tensor>& in) {
          const Tensor h = (*lin)(in[0]);
          return std::vector<Tensor>{h.tanh(), h.sigmoid()};
        },
        {x})[1];
  }
};

// Units around two-output nodes (autograd::checkpoint's with two outputs, the only local
// autograd node with several): one such node of the root's feeds units b and c, one output each,
// and unit a's output is the second of its own.
struct Forked : nn::Module {
  std::shared_ptr<nn::Linear> stem, b, c, head;
  std::shared_ptr<SecondOfTwo> a;
  Forked() : Module("Forked") {
    Generator gen(9);
    stem = register_module("stem", std::make_shared<nn::Linear>(4, 4, true, gen));
    b = register_module("b", std::make_shared<nn::Linear>(4, 4, true, gen));
    c = register_module("c", std::make_shared<nn::Linear>(4, 4, true, gen));
    a = register_module("a", std::make_shared<SecondOfTwo>(gen));
    head = register_module("head", std::make_shared<nn::Linear>(4, 3, true, gen));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    const std::vector<Tensor> parts = autograd::checkpoint(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0].tanh(), in[0] * in[0]};
        },
        {(*stem)(x)});
    return (*head)((*a)((*b)(parts[0]) + (*c)(parts[1])));
  }
};

}  // namespace

TEST_CASE(
    "units fed by a node with two outputs, and a unit whose output is one of a node's two: "
    "gradients and AdamW steps equal the unsharded model's",
    "[fsdp]") {
  // The blocks resharded after forward: unit a computes in backward only if its hook, on its
  // node's second input, gathered it. Three steps, the later ones prefetching in the order the
  // first recorded; each step's gradients and the parameters after it against the unsharded
  // model on the whole batch.
  Generator gen(17);
  const Tensor x = randn({4, 4}, gen, kFloat64), y = randn({4, 3}, gen, kFloat64);
  auto mse = [](const Tensor& out, const Tensor& target) {
    return ((out - target) * (out - target)).mean();
  };
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Forked>(), reference = std::make_shared<Forked>();
    for (const auto& unit : std::vector<std::shared_ptr<nn::Module>>{net->a, net->b, net->c})
      fsdp::fully_shard(unit, borrow(pg));
    fsdp::fully_shard(net, borrow(pg));
    const optim::AdamWOptions adamw{.lr = 0.01};
    optim::AdamW opt(net->parameters(), adamw), ref_opt(reference->parameters(), adamw);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      ref_opt.zero_grad();
      mse((*net)(x.narrow(0, 2 * pg.rank(), 2)), y.narrow(0, 2 * pg.rank(), 2)).backward();
      mse((*reference)(x), y).backward();
      const std::string when = "step " + std::to_string(step);
      fsdp::testing::check_rows(
          c, *net, *reference, pg.rank(), 2, when + ", gradients",
          [](const Tensor& t) { return t.grad().defined() ? t.grad() : t * 0; });
      opt.step();
      ref_opt.step();
      fsdp::testing::check_rows(c, *net, *reference, pg.rank(), 2, when + ", parameters",
                                [](const Tensor& t) { return t; });
    }
  });
}

TEST_CASE("set_reshard_after_backward(false): micro-batches gather each unit once per step",
          "[fsdp]") {
  // Gradient accumulation over 4 micro-batches, the units kept gathered from one to the next
  // (and through forward: reshard_after_forward false): each unit is gathered once a step,
  // where resharding after backward gathers it once per micro-batch; the next step's first
  // forward gathers again, as the optimizer changed the shards (the first test trains so
  // against one process). Counted in the flight recorder, as above.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto gathers_in_a_step = [&](bool keep) {
      auto net = std::make_shared<Net>();
      auto root = fsdp::testing::shard(net, borrow(pg), {.reshard_after_forward = false});
      root->set_reshard_after_backward(!keep);
      optim::AdamW opt(net->parameters(), {.lr = 0.01});
      auto [x, y] = fsdp::testing::batch(1, 0, 0);
      auto step = [&] {
        for (int micro = 0; micro < 4; ++micro) {
          root->set_requires_gradient_sync(micro == 3);
          net->loss(x, y).backward();
        }
        opt.step();
        opt.zero_grad();
      };
      step();
      return gathers_during(pg, step);  // the second step's
    };
    // Per rank, resharding after backward: each micro-batch gathers the root, a and b in
    // forward, and b again in backward (used twice, it is resharded after its second call's
    // backward, before its first's). Kept: the root, a and b once.
    EXPECT(c, gathers_in_a_step(false) == 2 * 4 * 4);
    EXPECT(c, gathers_in_a_step(true) == 2 * 3);
  });
}

TEST_CASE("units kept gathered after backward see a checkpoint loaded into their shards",
          "[fsdp][checkpoint]") {
  // The checkpoint's reader writes a CPU shard in place, not through an op: it moves the
  // shards' version counter, so that a kept unit is gathered again before it computes.
  namespace dcp = gw::dist::checkpoint;
  gw::test::TempDir dir("gw_fsdp_kept");
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    auto saved = std::make_shared<Net>();
    auto saved_root = fsdp::testing::shard(saved, borrow(pg));
    {
      autograd::NoGradGuard no_grad;
      for (Tensor& p : saved->parameters()) p.mul_(0.5);  // other values than a fresh Net's
    }
    dcp::save(dir.path, saved_root->sharded_state_dict(), pg);
    const double want = saved->loss(x, y).item<double>();

    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    root->set_reshard_after_backward(false);
    net->loss(x, y).backward();  // every unit kept gathered, from the fresh values
    dcp::load(dcp::Reader(dir.path), root->sharded_state_dict(), pg);
    const double got = net->loss(x, y).item<double>();
    EXPECT(c, got == want);
  });
}

TEST_CASE("fully_shard at world size 1 is the unsharded model", "[fsdp]") {
  run_ranks(1, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    fsdp::testing::check_matches_single_process(borrow(pg), c, {.options = {}, .steps = 3});
  });
}

TEST_CASE("fully_shard frees a unit's parameters outside its call and gathers them in it",
          "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    const Tensor member = net->a->ln_1->weight;             // what the block's forward reads
    EXPECT(c, net->a->ln_1->parameters()[0].numel() == 3);  // the shard: 6 rows over 2 ranks
    EXPECT_THROWS(c, StateError, member.sum(), "released");
    // Called through forward() instead of operator(), the unit's hooks do not run.
    EXPECT_THROWS(c, StateError, net->a->forward(zeros({1, 2, 6}, kFloat64)), "operator()");
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    Tensor loss = net->loss(x, y);  // the blocks were gathered and freed again; the root stays
    EXPECT_THROWS(c, StateError, member.sum(), "released");
    loss.backward();
    EXPECT(c, net->emb->parameters()[0].grad().defined());
    // unshard() makes the whole parameter readable, on every rank alike.
    root->unshard();
    EXPECT(c, net->emb->weight.sizes() == Shape({fsdp::testing::kVocab, 6}));
    EXPECT(c, std::isfinite(net->emb->weight.sum().item<double>()));
    root->reshard();
  });
}

TEST_CASE(
    "fully_shard: parameters frozen before sharding or after, through the shard or the module's "
    "member, train as the same freezes unsharded",
    "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>(), reference = std::make_shared<Net>();
    // Frozen before sharding, through the member: the shard is born frozen.
    net->a->ln_1->weight.requires_grad_(false);
    auto root = fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), {.lr = 0.01});
    optim::AdamW ref_opt(reference->parameters(), {.lr = 0.01});
    // This rank's 3 of each LayerNorm's 6 rows (the registered shards), and the whole ones.
    Tensor a_shard = net->a->ln_1->parameters()[0], b_shard = net->b->ln_1->parameters()[0];
    Tensor ln_member = net->ln->weight, ln_shard = net->ln->parameters()[0];
    auto freeze = [&](bool frozen) {
      b_shard.requires_grad_(!frozen);    // after sharding, through the shard
      ln_member.requires_grad_(!frozen);  // after sharding, through the member
      reference->a->ln_1->weight.requires_grad_(!frozen);
      reference->b->ln_1->weight.requires_grad_(!frozen);
      reference->ln->weight.requires_grad_(!frozen);
    };
    auto step = [&](int s) {
      auto [x, y] = fsdp::testing::batch(2, s, 0);
      const int64_t n = fsdp::testing::kPerRank;
      opt.zero_grad();
      net->loss(x.narrow(0, pg.rank() * n, n), y.narrow(0, pg.rank() * n, n)).backward();
      opt.step();
      ref_opt.zero_grad();
      reference->loss(x, y).backward();
      ref_opt.step();
    };
    const std::vector<Tensor> was = {a_shard.clone(), b_shard.clone(), ln_shard.clone()};
    freeze(true);
    step(0);
    step(1);
    EXPECT(c, !a_shard.grad().defined() && !b_shard.grad().defined() && !ln_shard.grad().defined());
    EXPECT(c, equal(a_shard, was[0]) && equal(b_shard, was[1]) && equal(ln_shard, was[2]));
    fsdp::testing::check_rows(c, *net, *reference, pg.rank(), 2, "frozen",
                              [](const Tensor& t) { return t; });
    a_shard.requires_grad_(true);  // frozen through the member, unfrozen through the shard
    freeze(false);
    step(2);
    EXPECT(c, !equal(a_shard, was[0]) && !equal(b_shard, was[1]) && !equal(ln_shard, was[2]));
    fsdp::testing::check_rows(c, *net, *reference, pg.rank(), 2, "unfrozen",
                              [](const Tensor& t) { return t; });
    // Frozen between a forward and its backward: that backward still gives the gradients, as
    // without sharding, to a block gathered again for it and to the root, gathered throughout.
    auto [x, y] = fsdp::testing::batch(2, 3, 0);
    const int64_t n = fsdp::testing::kPerRank;
    opt.zero_grad();
    ref_opt.zero_grad();
    Tensor loss = net->loss(x.narrow(0, pg.rank() * n, n), y.narrow(0, pg.rank() * n, n));
    Tensor ref_loss = reference->loss(x, y);
    freeze(true);
    loss.backward();
    ref_loss.backward();
    opt.step();
    ref_opt.step();
    fsdp::testing::check_rows(c, *net, *reference, pg.rank(), 2, "frozen between",
                              [](const Tensor& t) { return t; });
  });
}

#ifdef GW_FSDP_PROBE
TEST_CASE("fully_shard on the MPI group under mpirun -np 2 and -np 4", "[fsdp][mpi][process]") {
  GW_SKIP_WITHOUT_MPIRUN();
  for (int ranks : {2, 4}) {
    const auto run = gw::test::mpirun(ranks, GW_FSDP_PROBE, "", 300);
    INFO("mpirun -np " << ranks << "\n" << run.output);
    CHECK(run.exit_code == 0);
    for (int r = 0; r < ranks; ++r) {
      std::smatch m;
      const std::regex line("rank " + std::to_string(r) + ": ([0-9]+) checks, 0 failed");
      CHECK(std::regex_search(run.output, m, line));
      if (!m.empty()) CHECK(std::stoi(m[1]) > 20);
    }
  }
}
#endif

TEST_CASE("fsdp::clip_grad_norm_ over shards is the unsharded model's norm and clipping",
          "[fsdp]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto reference = std::make_shared<Net>();
    fsdp::testing::shard(net, borrow(pg));
    auto [x, y] = fsdp::testing::batch(2, 0, 0);
    const int64_t n = fsdp::testing::kPerRank;
    net->loss(x.narrow(0, pg.rank() * n, n), y.narrow(0, pg.rank() * n, n)).backward();
    reference->loss(x, y).backward();
    const double norm = fsdp::clip_grad_norm_(net->parameters(), 0.01, pg);
    const double want = optim::clip_grad_norm_(reference->parameters(), 0.01).item<double>();
    EXPECT(c, std::abs(norm - want) <= 1e-12 * want);
    EXPECT(c, want > 0.01);  // so both were scaled
    fsdp::testing::check_rows(
        c, *net, *reference, pg.rank(), 2, "clipped gradients",
        [](const Tensor& t) { return t.grad().defined() ? t.grad() : t * 0; });
  });
}

TEST_CASE(
    "HSDP: fsdp::clip_grad_norm_ over the shard group is the unsharded model's norm and "
    "clipping, each row counted once",
    "[fsdp]") {
  // 4 ranks as 2 replicas x 2 shards. After backward every replica's shards hold the same
  // gradients (the average over all 4 ranks' rows), so the squares are summed over the shard
  // group, as the documentation says to pass it: summed over the replicas too, each row would
  // count twice (sqrt(2) times the norm), and over this rank's shards alone, half of them.
  auto store = std::make_shared<store::HashStore>();
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const auto groups = fsdp::testing::hsdp_groups(store, pg.rank());
    auto net = std::make_shared<Net>(), reference = std::make_shared<Net>();
    fsdp::testing::shard(net, groups.shard, {.replicate_group = groups.replicate});
    auto [x, y] = fsdp::testing::batch(4, 0, 0);
    const int64_t n = fsdp::testing::kPerRank,
                  row = groups.replicate->rank() * groups.shard->size() + groups.shard->rank();
    net->loss(x.narrow(0, row * n, n), y.narrow(0, row * n, n)).backward();
    reference->loss(x, y).backward();
    const double norm = fsdp::clip_grad_norm_(net->parameters(), 0.01, *groups.shard);
    const double want = optim::clip_grad_norm_(reference->parameters(), 0.01).item<double>();
    c.expect(std::abs(norm - want) <= 1e-12 * want,
             gw::detail::str("rank ", pg.rank(), ": total norm ", norm, ", unsharded ", want));
    EXPECT(c, want > 0.01);  // so both were scaled
    fsdp::testing::check_rows(
        c, *net, *reference, groups.shard->rank(), groups.shard->size(),
        "replica " + std::to_string(groups.replicate->rank()) + ", clipped gradients",
        [](const Tensor& t) { return t.grad().defined() ? t.grad() : t * 0; });
  });
}
