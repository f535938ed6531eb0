// fully_shard's mixed precision on 2 Gloo thread-ranks: float32 or bfloat16 compute over wider
// shards stays close to training in the shards' dtype; gradients accumulate and reduce in the
// wider dtype; autocast; ShardedGradScaler's one decision for every rank.
#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "core/autocast.h"
#include "fsdp/sharded_grad_scaler.h"
#include "optim/adamw.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/fsdp/fsdp_checks.h"
#include "tests/fsdp/fsdp_test_util.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::fsdp::testing::borrow;
using gw::fsdp::testing::Net;
using gw::fsdp::testing::throw_in_backward_of;

TEST_CASE("fully_shard with float32 compute over float64 shards stays close to float64", "[fsdp]") {
  // The policy one step up from bfloat16 over float32: the members, activations and gradients
  // are float32; reductions and AdamW's state float64. The bound: float32 gradients are right to
  // about 1e-7 relative, AdamW's normalized steps of lr = 0.01 carry that into each parameter, and
  // 20 steps add up to about 1e-7 (measured: at most 1.1e-7); 1e-5 leaves room, and float32 compute
  // cannot pass 1e-12 (the exact case in test_fsdp.cpp).
  const fsdp::FullyShardOptions mixed{
      .reshard_after_forward = true,
      .mp_policy = {.param_dtype = kFloat32, .reduce_dtype = kFloat64}};
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    fsdp::testing::check_matches_single_process(
        borrow(pg), c, {.options = mixed, .micro_batches = 1, .steps = 20, .tolerance = 1e-5});
    auto net = std::make_shared<Net>();
    fsdp::testing::shard(net, borrow(pg), mixed);
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    const Tensor loss = net->loss(x, y);
    EXPECT(c, loss.dtype() == kFloat32);  // computed in float32
    loss.backward();
    EXPECT(c, net->emb->parameters()[0].dtype() == kFloat64);
    EXPECT(c, net->emb->parameters()[0].grad().dtype() == kFloat64);
  });
}

TEST_CASE("fully_shard with bfloat16 compute over float32 shards stays close to float32",
          "[fsdp]") {
  // FSDP2's mixed precision: the blocks gathered and computed in bfloat16 (on the CPU through
  // float32 copies, rounded as a GPU rounds), gradients reduced in float32 into float32 shards
  // and AdamW's state, against the same model trained in float32 in one process. The bound:
  // bfloat16 keeps 8 bits, so gradients are right to about 1e-2 relative, and AdamW's
  // normalized steps (about +-lr = 0.01 each) turn that into a sign where a gradient is small:
  // 20 steps bound a parameter's difference by 0.4. Measured: at most 0.033 (typically 1e-3 to
  // 1e-2); the check is 0.05 relative and absolute. float32 compute stays within 1e-5 (above).
  const fsdp::FullyShardOptions mixed{
      .reshard_after_forward = true,
      .mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32}};
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    fsdp::testing::check_matches_single_process(
        borrow(pg), c,
        {.options = mixed, .micro_batches = 1, .steps = 20, .tolerance = 5e-2, .dtype = kFloat32});
    auto net = std::make_shared<Net>(6, kFloat32);
    fsdp::testing::shard(net, borrow(pg), mixed);
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    const Tensor logits = (*net)(x);
    EXPECT(c, logits.dtype() == kBFloat16);  // computed in bfloat16
    nn::functional::cross_entropy(logits.reshape({-1, fsdp::testing::kVocab}), y.reshape({-1}))
        .backward();
    EXPECT(c, net->emb->parameters()[0].dtype() == kFloat32);
    EXPECT(c, net->emb->parameters()[0].grad().dtype() == kFloat32);
  });
}

TEST_CASE(
    "units of different policies compose: bfloat16 blocks returning float32 under a "
    "float32 root",
    "[fsdp]") {
  // FSDP2's casts at every unit: each block casts its input to its param_dtype and its output to
  // its output_dtype, so the blocks compute in bfloat16 and the root's norm and head in float32.
  // Trained 20 steps against the float32 model in one process, within the bound of the
  // bfloat16 test above (the root's layers in float32 only bring it closer).
  const fsdp::FullyShardOptions blocks{
      .mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32, .output_dtype = kFloat32}};
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    fsdp::testing::check_matches_single_process(
        borrow(pg), c, {.options = {}, .blocks = blocks, .tolerance = 5e-2, .dtype = kFloat32});
    auto net = std::make_shared<Net>(6, kFloat32);
    fsdp::testing::shard(net, borrow(pg), {}, blocks);
    std::vector<DType> seen;  // what the blocks' layers take, and the root's norm
    auto record = [&](nn::Module& m) {
      m.register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor&) {
        seen.push_back(in.dtype());
        return Tensor();
      });
    };
    record(*net->a->ln_1);
    record(*net->ln);
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    const Tensor loss = net->loss(x, y);
    EXPECT(c, (seen == std::vector<DType>{kBFloat16, kFloat32}));
    EXPECT(c, loss.dtype() == kFloat32);
    loss.backward();
    for (const Tensor& p : net->a->parameters())
      EXPECT(c, p.dtype() == kFloat32 && p.grad().defined() && p.grad().dtype() == kFloat32);
  });
}

TEST_CASE("gradient accumulation under bfloat16 compute sums in the reduction's float32",
          "[fsdp]") {
  // Eight micro-batches summed without sync and reduced once, against a reduction after each
  // (in float32, added on the float32 shards' .grad): the same bfloat16 gradients either way.
  // Summed in float32 the two differ by float32 rounding (about 1e-7 of the largest); summed in
  // bfloat16 on the members, by about 2^-9 at each addition (measured: 3e-3).
  const fsdp::FullyShardOptions mixed{
      .mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32}};
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    using fsdp::testing::kPerRank;
    constexpr int kMicroBatches = 8;
    // The shards' gradients after micro-batches [first, 8), the last with sync; `fail_at`: that
    // micro-batch's backward throws (on both ranks) and the accumulation starts again.
    auto gradients = [&](bool sync_each, int first, int fail_at) {
      auto net = std::make_shared<Net>(6, kFloat32);
      auto root = fsdp::testing::shard(net, borrow(pg), mixed);
      for (int micro = first; micro < kMicroBatches; ++micro) {
        auto [x, y] = fsdp::testing::batch(2, 0, micro);
        root->set_requires_gradient_sync(sync_each || micro + 1 == kMicroBatches);
        auto loss = [&] {
          return net->loss(x.narrow(0, pg.rank() * kPerRank, kPerRank),
                           y.narrow(0, pg.rank() * kPerRank, kPerRank));
        };
        if (micro != fail_at) {
          loss().backward();
          continue;
        }
        // The gradient reaching block a's output throws, after block b kept its gradients.
        const int64_t hook = throw_in_backward_of(*net->a);
        EXPECT_THROWS(c, std::exception, loss().backward(), "injected");
        net->a->remove_hook(hook);
      }
      std::vector<Tensor> grads;
      for (const Tensor& p : net->parameters()) grads.push_back(p.grad());
      return grads;
    };
    auto expect_same = [&](const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                           const std::string& what) {
      EXPECT(c, got.size() == want.size());
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        EXPECT(c, got[i].defined() == want[i].defined());
        if (!got[i].defined() || !want[i].defined() || want[i].numel() == 0) continue;
        EXPECT(c, got[i].dtype() == kFloat32);
        const double off = (got[i] - want[i]).abs().max().item<double>();
        const double largest = want[i].abs().max().item<double>();
        c.expect(off <= 1e-5 * largest,
                 gw::detail::str(what, ", parameter ", i, ": the sums differ by ", off, " of ",
                                 largest));
      }
    };
    expect_same(gradients(false, 0, -1), gradients(true, 0, -1), "summed once or reduced each");
    // A backward that fails forgets the sum kept before it: after micro-batch 2 fails, the
    // sum is that of micro-batches 3 to 7, as if they were all there ever was.
    expect_same(gradients(false, 0, 2), gradients(false, 3, -1), "after a failed backward");
  });
}

TEST_CASE("fully_shard under bfloat16 autocast trains as one process under autocast", "[fsdp]") {
  // Float32 shards gathered in float32; autocast lowers the blocks' products to bfloat16 inside
  // the units' calls, and backward (outside it) reduces float32 gradients. Both runs round the
  // same products to bfloat16, but each rank's weight gradients cover half the batch, rounded
  // apart before they are summed: measured at most 1.1e-3 after 20 steps; 1e-2 leaves room.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    fsdp::testing::check_matches_single_process(borrow(pg), c,
                                                {.options = {},
                                                 .micro_batches = 1,
                                                 .steps = 20,
                                                 .tolerance = 1e-2,
                                                 .dtype = kFloat32,
                                                 .autocast = true});
    auto net = std::make_shared<Net>(6, kFloat32);
    fsdp::testing::shard(net, borrow(pg));
    auto [x, y] = fsdp::testing::batch(1, 0, 0);
    Tensor logits;
    {
      AutocastGuard amp(DeviceType::CPU, kBFloat16);
      logits = (*net)(x);
    }
    EXPECT(c, logits.dtype() == kBFloat16);
    nn::functional::cross_entropy(logits.reshape({-1, fsdp::testing::kVocab}), y.reshape({-1}))
        .backward();
    EXPECT(c, net->emb->parameters()[0].grad().dtype() == kFloat32);
  });
}

TEST_CASE("ShardedGradScaler: an inf in one rank's shard skips every rank's step", "[fsdp][amp]") {
  // With optim::GradScaler, rank 1 (finite shards) would step while rank 0 skipped.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = std::make_shared<Net>(6, kFloat32);
    fsdp::testing::shard(net, borrow(pg));
    optim::AdamW opt(net->parameters(), {.lr = 0.01});
    fsdp::ShardedGradScaler scaler(borrow(pg), {.init_scale = 1024});
    const int64_t first = pg.rank() * fsdp::testing::kPerRank;
    auto backward = [&](int step) {
      opt.zero_grad();
      auto [x, y] = fsdp::testing::batch(2, step, 0);
      const Tensor loss = net->loss(x.narrow(0, first, fsdp::testing::kPerRank),
                                    y.narrow(0, first, fsdp::testing::kPerRank));
      scaler.scale(loss).backward();
    };
    auto snapshot = [&] {
      std::vector<Tensor> out;
      for (const Tensor& p : net->parameters()) out.push_back(p.clone());
      return out;
    };
    auto unchanged = [&](const std::vector<Tensor>& before) {
      bool same = true;
      for (size_t i = 0; i < before.size(); ++i)
        same = same && equal(net->parameters()[i], before[i]);
      return same;
    };
    backward(0);
    if (pg.rank() == 0)  // rank 0's rows of the embedding overflowed
      net->emb->parameters()[0].grad().view({-1}).narrow(0, 0, 1).fill_(
          std::numeric_limits<double>::infinity());
    const std::vector<Tensor> before = snapshot();
    EXPECT(c, !scaler.step(opt));
    scaler.update();
    EXPECT(c, scaler.get_scale() == 512);
    EXPECT(c, unchanged(before));
    backward(1);  // finite everywhere: every rank steps
    EXPECT(c, scaler.step(opt));
    scaler.update();
    EXPECT(c, scaler.get_scale() == 512);
    EXPECT(c, !unchanged(before));
    // An optimizer whose shards on rank 1 hold no gradient (the 0-dim scale lives on rank 0):
    // rank 1 steps with rank 0 rather than refusing a step with nothing checked.
    Tensor scale_shard;
    for (const auto& [name, t] : net->named_parameters())
      if (name == "scale") scale_shard = t;
    EXPECT(c, scale_shard.numel() == (pg.rank() == 0 ? 1 : 0));
    optim::AdamW scale_opt({scale_shard}, {.lr = 0.01});
    backward(2);
    try {
      EXPECT(c, scaler.step(opt));
      EXPECT(c, scaler.step(scale_opt));
    } catch (const std::exception& e) {
      c.expect(false, "rank " + std::to_string(pg.rank()) + " refused to step: " + e.what());
    }
    scaler.update();
  });
}
