// fully_shard's checkpoints as threads over Gloo: sharded state dicts saved at one world size
// and loaded at another, the full state dict, refusals of another model's or a whole-tensor
// optimizer state, and one optimizer over two roots.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/autograd.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "optim/adamw.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/fsdp/fsdp_checks.h"
#include "tests/fsdp/fsdp_test_util.h"
#include "tests/temp_dir.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::fsdp::testing::borrow;
using gw::fsdp::testing::Net;

TEST_CASE("one optimizer over two roots: each root saves and loads every unit's rows",
          "[fsdp][checkpoint]") {
  // Two roots under one AdamW (an encoder and a decoder; a pipeline rank's stages): the moments
  // of the other root's shards are rows of their parameters too, not tensors of a shard's shape,
  // of which the checkpoint would keep one rank's.
  namespace dcp = gw::dist::checkpoint;
  gw::test::TempDir dir("gw_fsdp_two_roots");
  auto build = [](dist::ProcessGroupGloo& pg) {
    Generator gen(3);
    auto a = std::make_shared<nn::Linear>(4, 4, true, gen);
    auto b = std::make_shared<nn::Linear>(4, 4, true, gen);
    auto root_a = fsdp::fully_shard(a, borrow(pg));
    auto root_b = fsdp::fully_shard(b, borrow(pg));
    std::vector<Tensor> params = a->parameters();
    for (const Tensor& t : b->parameters()) params.push_back(t);
    return std::tuple{a, b, root_a, root_b, params};
  };
  std::vector<NamedTensors> saved(2);
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto [a, b, root_a, root_b, params] = build(pg);
    optim::AdamW opt(params, {.lr = 0.01});
    Generator gen(10 + pg.rank());  // each rank its own batch: its moments differ
    (*b)((*a)(randn({3, 4}, gen))).pow(2).sum().backward();
    opt.step();
    for (const auto& [key, t] : opt.state_dict()) saved[pg.rank()].emplace(key, t.clone());
    dcp::save(dir.path, root_a->sharded_optimizer_state(opt, "optim."), pg);
    EXPECT(c, std::filesystem::exists(dir.path + "/index.json"));
  });
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto [a, b, root_a, root_b, params] = build(pg);
    optim::AdamW opt(params, {.lr = 0.01});
    root_a->load_optimizer_state(opt, dcp::Reader(dir.path), "optim.");
    const NamedTensors got = opt.state_dict(), want = saved[pg.rank()];
    EXPECT(c, got.size() == want.size());
    for (const auto& [key, t] : want)
      c.expect(got.contains(key) && equal(got.at(key), t),
               "rank " + std::to_string(pg.rank()) + " restored " + key);
  });
}

TEST_CASE(
    "a sharded checkpoint saved at 4 ranks loads at 2 and training goes on identically; "
    "the full state dict is the unsharded model's",
    "[fsdp][checkpoint]") {
  namespace dcp = gw::dist::checkpoint;
  gw::test::TempDir dir("gw_fsdp_ckpt");
  const optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
  // Steps [from, to) on `world` ranks, each rank its rows of every global batch.
  auto train = [](Net& net, optim::AdamW& opt, int r, int world, int from, int to) {
    const int64_t n = fsdp::testing::kPerRank * 4 / world;  // the global batch of 4 ranks
    for (int step = from; step < to; ++step) {
      auto [x, y] = fsdp::testing::batch(4, step, 0);
      opt.zero_grad();
      net.loss(x.narrow(0, r * n, n), y.narrow(0, r * n, n)).backward();
      opt.step();
    }
  };
  NamedTensors rank0_state;  // at 2 ranks, after loading: see the end
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), adamw);
    train(*net, opt, pg.rank(), 4, 0, 3);
    dcp::ShardedState state = root->sharded_state_dict("model.");
    state.merge(root->sharded_optimizer_state(opt, "optim."));
    dcp::save(dir.path, state, pg);
    EXPECT(c, std::filesystem::exists(dir.path + "/index.json"));
  });
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), adamw);
    dcp::Reader ckpt(dir.path);
    dcp::load(ckpt, root->sharded_state_dict("model."), pg);
    root->load_optimizer_state(opt, ckpt, "optim.");
    train(*net, opt, pg.rank(), 2, 3, 6);

    // The same six steps unsharded, on the whole global batches.
    auto reference = std::make_shared<Net>();
    optim::AdamW ref_opt(reference->parameters(), adamw);
    for (int step = 0; step < 6; ++step) {
      auto [x, y] = fsdp::testing::batch(4, step, 0);
      ref_opt.zero_grad();
      reference->loss(x, y).backward();
      ref_opt.step();
    }
    fsdp::testing::check_rows(c, *net, *reference, pg.rank(), 2, "resumed at 2 ranks",
                              [](const Tensor& t) { return t; });
    // Gathered whole on every rank: the unsharded model's state dict, both names of the tied
    // weight included.
    const NamedTensors full = root->full_state_dict();
    const NamedTensors want = reference->state_dict();
    EXPECT(c, full.size() == want.size());
    for (const auto& [name, t] : want)
      c.expect(full.contains(name) && allclose(full.at(name), t, 1e-12, 1e-12),
               "full_state_dict " + name);
    // A checkpoint of another model is refused on every rank, and nothing changes.
    auto wider = std::make_shared<Net>(8);
    auto wider_root = fsdp::testing::shard(wider, borrow(pg));
    const Tensor before = wider->parameters()[1].clone();
    EXPECT_THROWS(c, std::exception, dcp::load(ckpt, wider_root->sharded_state_dict("model."), pg),
                  "model.");
    EXPECT(c, equal(wider->parameters()[1], before));
    if (pg.rank() == 0)
      for (const auto& [key, t] : opt.state_dict()) rank0_state.emplace(key, t.clone());
  });
  // Rank 0's sharded optimizer state saved as whole tensors (its state_dict() as is, by one
  // process): shards' shapes, which fit rank 0's rows (and any rank's with as many) and would
  // give them rank 0's moments. Refused on every rank, and every optimizer is as it was.
  const std::string as_is = dir.path + "/as_is";
  run_ranks(1, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    EXPECT(c, !rank0_state.empty());
    dcp::save(as_is, dcp::whole(rank0_state, "optim."), pg);
  });
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), adamw);
    train(*net, opt, pg.rank(), 2, 0, 1);
    const NamedTensors kept = opt.state_dict();
    EXPECT_THROWS(c, ShapeError, root->load_optimizer_state(opt, dcp::Reader(as_is), "optim."),
                  "[load_optimizer_state] optim.state.", "but its parameter's whole shape is");
    for (const auto& [key, t] : opt.state_dict())
      c.expect(kept.contains(key) && equal(kept.at(key), t), "optimizer state " + key);
  });
  // At world size 1 a shard is its parameter: the optimizer's state_dict() saved as is loads,
  // the 0-dim scale's moments ([1], its shard's shape) among them.
  run_ranks(1, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>();
    auto root = fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), adamw);
    train(*net, opt, 0, 1, 0, 1);
    const std::string whole = dir.path + "/whole";
    dcp::save(whole, dcp::whole(opt.state_dict(), "optim."), pg);
    optim::AdamW fresh(net->parameters(), adamw);
    root->load_optimizer_state(fresh, dcp::Reader(whole), "optim.");
    const NamedTensors want = opt.state_dict(), got = fresh.state_dict();
    EXPECT(c, got.size() == want.size());
    for (const auto& [key, t] : want)
      c.expect(got.contains(key) && equal(got.at(key), t), "loaded " + key);
  });
}
