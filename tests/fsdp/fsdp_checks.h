// fully_shard against single-process training, run by every rank of a group, whether the ranks
// are threads over Gloo (test_fsdp) or processes under mpirun (fsdp_probe). The model is small
// and float64, and holds what sharding must get right: rows that do not divide by the world
// size (width 6, vocabulary 11 on 4 ranks: a rank whose shard of a bias is empty), weights tied
// between the embedding and the head, a unit called twice per forward, and a parameter no
// forward uses (it must keep no .grad, so that AdamW leaves it alone as it would unsharded),
// five rows on 4 ranks (the last rank's rows start past the end) and a 0-dim parameter.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "autograd/activation_checkpoint.h"
#include "core/ops.h"
#include "core/random.h"
#include "fsdp/fully_shard.h"
#include "nn/nn.h"
#include "optim/adamw.h"
#include "tests/dist/process_group/checks.h"

namespace gw::fsdp::testing {

constexpr int64_t kVocab = 11;
constexpr int64_t kLength = 8;
constexpr int64_t kPerRank = 2;  // sequences per rank per micro-batch

struct Net : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::GPTBlock> a, b;
  std::shared_ptr<nn::Linear> unused;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> head;
  Tensor scale;  // 0-dim: one row, on rank 0

  explicit Net(int64_t width = 6, DType dtype = kFloat64) : Module("Net") {
    Generator gen(7);
    emb = register_module("emb", std::make_shared<nn::Embedding>(kVocab, width, gen));
    // Without biases in the blocks' projections: attention ignores the key's bias, whose
    // gradient is zero up to rounding, and AdamW would turn that rounding into steps of lr.
    const nn::GPTBlockOptions block{.mlp_ratio = 4, .dropout = 0.0, .bias = false};
    a = register_module("a", std::make_shared<nn::GPTBlock>(width, 2, block, gen));
    b = register_module("b", std::make_shared<nn::GPTBlock>(width, 2, block, gen));
    unused = register_module("unused", std::make_shared<nn::Linear>(width, 5, true, gen));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(width));
    head = register_module("head", std::make_shared<nn::Linear>(width, kVocab, false, gen));
    head->tie_weight(emb->weight);
    scale = register_parameter("scale", full({}, 1.5));
    to(dtype);
  }
  Tensor forward(const Tensor& tokens) override {
    Tensor x = block(*a, (*emb)(tokens));
    for (int i = 0; i < b_calls; ++i) x = block(*b, x);
    return (*head)((*ln)(x)) * scale;
  }
  // A block's call, its activations recomputed in backward when checkpoint_blocks is set.
  Tensor block(nn::GPTBlock& m, const Tensor& x) {
    if (!checkpoint_blocks) return m(x);
    return autograd::checkpoint([&m](const Tensor& t) { return m(t); }, x);
  }
  bool checkpoint_blocks = false;
  int b_calls = 2;  // block b is used twice
  Tensor loss(const Tensor& tokens, const Tensor& targets) {
    return nn::functional::cross_entropy((*this)(tokens).reshape({-1, kVocab}),
                                         targets.reshape({-1}));
  }
};

// The blocks, then the root, as a user shards a transformer; the blocks with `blocks` when
// given (another policy than the root's).
inline std::shared_ptr<FSDPModule> shard(const std::shared_ptr<Net>& net,
                                         std::shared_ptr<dist::ProcessGroup> pg,
                                         FullyShardOptions options = {},
                                         std::optional<FullyShardOptions> blocks = std::nullopt) {
  fully_shard(net->a, pg, blocks.value_or(options));
  fully_shard(net->b, pg, blocks.value_or(options));
  return fully_shard(net, pg, options);
}

// Micro-batch `micro` of step `step`, for every rank: (world * kPerRank, kLength) tokens and
// their targets. Rank r trains on rows [r * kPerRank, (r + 1) * kPerRank).
inline std::pair<Tensor, Tensor> batch(int world, int step, int micro) {
  Generator gen(1000 + static_cast<uint64_t>(step) * 10 + static_cast<uint64_t>(micro));
  Tensor t = randint(0, kVocab, {world * kPerRank, kLength + 1}, gen);
  return {t.narrow(1, 0, kLength).contiguous(), t.narrow(1, 1, kLength).contiguous()};
}

// Rank r's rows of a whole parameter (what its shard must equal), flattened to (rows, -1).
inline Tensor rows_of(const Tensor& whole, int r, int world) {
  const int64_t rows = whole.dim() == 0 ? 1 : whole.size(0);
  const int64_t per_rank = (rows + world - 1) / world;
  const int64_t mine = std::clamp<int64_t>(rows - r * per_rank, 0, per_rank);
  return whole.reshape({rows, -1}).narrow(0, std::min(r * per_rank, rows), mine);
}

// Each of `shards` (the sharded model's, by name) equals rank r's rows of the same-named tensor
// of `wholes` to `tolerance` (relative, and absolute near zero); `what` picks the tensor (the
// parameter, or its .grad).
inline void check_rows(dist::testing::Checks& c, const nn::Module& sharded, const nn::Module& whole,
                       int r, int world, const std::string& context,
                       const std::function<Tensor(const Tensor&)>& what, double tolerance = 1e-12) {
  const auto shards = sharded.named_parameters();
  const auto wholes = whole.named_parameters();
  c.expect(shards.size() == wholes.size(), "the sharded model lists every parameter once");
  for (size_t i = 0; i < std::min(shards.size(), wholes.size()); ++i) {
    const Tensor got = what(shards[i].second);
    const Tensor want = rows_of(what(wholes[i].second), r, world);
    const bool ok = got.numel() == want.numel() &&
                    allclose(got.reshape(want.sizes()), want, tolerance, tolerance);
    const double off = ok || got.numel() != want.numel()
                           ? 0
                           : (got.reshape(want.sizes()) - want).abs().max().item<double>();
    c.expect(ok, gw::detail::str("rank ", r, " of ", world, ", ", context, ": ", shards[i].first,
                                 " shard ", shape_str(got.sizes()), " equals its rows (off by ",
                                 off, ")"));
  }
}

struct Case {
  FullyShardOptions options;
  std::optional<FullyShardOptions> blocks = std::nullopt;  // the blocks', when not `options`
  int micro_batches = 1;  // the first ones without gradient sync
  // HSDP: the first micro-batches with sync but without the sum over the replicas instead
  // (set_requires_all_reduce(false))
  bool all_reduce_last = false;
  int steps = 20;
  double tolerance = 1e-12;
  DType dtype = kFloat64;  // of both models' parameters (the shards')
  bool autocast = false;   // both models' forwards under bfloat16 autocast
  bool checkpoint = false;  // the sharded model's blocks under autograd::checkpoint
  bool keep_gathered = false;  // set_reshard_after_backward(false) throughout
  Device device = kCPU;    // the sharded model's (the group's); the reference is on the CPU
};

inline std::string describe(const Case& k) {
  return gw::detail::str(
      k.options.replicate_group ? gw::detail::str(k.options.replicate_group->size(), " replicas, ")
                                : std::string(),
      "reshard_after_forward ", k.options.reshard_after_forward, ", micro-batches ",
      k.micro_batches, k.options.mp_policy.param_dtype ? ", compute in " : "",
      k.options.mp_policy.param_dtype ? dtype_name(*k.options.mp_policy.param_dtype) : "",
      k.blocks && k.blocks->mp_policy.param_dtype ? ", blocks in " : "",
      k.blocks && k.blocks->mp_policy.param_dtype ? dtype_name(*k.blocks->mp_policy.param_dtype)
                                                  : "",
      k.autocast ? ", under bfloat16 autocast" : "", k.checkpoint ? ", blocks checkpointed" : "",
      k.keep_gathered ? ", kept gathered after backward" : "",
      k.all_reduce_last ? ", summed over the replicas at the last micro-batch only" : "",
      k.options.offload_policy ? ", shards offloaded to the CPU" : "", " on ", k.device.str());
}

// Trains the sharded model beside the unsharded one (which sees every rank's rows) with AdamW
// and checks, after the last step, that each shard equals its rows of the unsharded parameter
// to 1e-12 relative, and that the unused parameter has no .grad and never moved.
inline void check_matches_single_process(std::shared_ptr<dist::ProcessGroup> pg,
                                         dist::testing::Checks& c, const Case& k) {
  const int world = pg->size(), r = pg->rank();  // the shard group's
  // The batch's rows: every rank's, replicas (HSDP) after one another.
  const auto& replicas = k.options.replicate_group;
  const int ranks = world * (replicas ? replicas->size() : 1),
            row = (replicas ? replicas->rank() * world : 0) + r;
  auto net = std::make_shared<Net>(6, k.dtype);
  net->to(k.device);
  net->checkpoint_blocks = k.checkpoint;
  auto reference = std::make_shared<Net>(6, k.dtype);
  const Tensor unused_before = reference->unused->weight.clone();
  std::shared_ptr<FSDPModule> root = shard(net, pg, k.options, k.blocks);
  if (k.keep_gathered) root->set_reshard_after_backward(false);
  const optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
  optim::AdamW opt(net->parameters(), adamw);
  optim::AdamW ref_opt(reference->parameters(), adamw);
  for (int step = 0; step < k.steps; ++step) {
    opt.zero_grad();
    ref_opt.zero_grad();
    for (int micro = 0; micro < k.micro_batches; ++micro) {
      auto [x, y] = batch(ranks, step, micro);
      if (k.all_reduce_last)
        root->set_requires_all_reduce(micro + 1 == k.micro_batches);
      else
        root->set_requires_gradient_sync(micro + 1 == k.micro_batches);
      Tensor mine, whole;
      {
        std::optional<AutocastGuard> amp;
        if (k.autocast) amp.emplace(DeviceType::CPU, kBFloat16);
        mine = net->loss(x.narrow(0, row * kPerRank, kPerRank).to(k.device),
                         y.narrow(0, row * kPerRank, kPerRank).to(k.device));
        whole = reference->loss(x, y);
      }
      mine.backward();
      whole.backward();
    }
    opt.step();
    ref_opt.step();
  }
  check_rows(
      c, *net, *reference, r, world, describe(k), [](const Tensor& t) { return t.to(kCPU); },
      k.tolerance);
  c.expect(net->emb->parameters()[0].grad().defined(), "the embedding's shard has a gradient");
  for (const Tensor& p : net->unused->parameters())
    c.expect(!p.grad().defined(), "unused: no grad");
  const Tensor unused_rows = rows_of(unused_before, r, world);
  c.expect(equal(net->unused->parameters()[0].to(kCPU).reshape(unused_rows.sizes()), unused_rows),
           "the unused weight never moved");
  const Device shards_on = k.options.offload_policy ? kCPU : k.device;
  for (const Tensor& p : net->parameters())
    c.expect(p.device() == shards_on && (!p.grad().defined() || p.grad().device() == shards_on),
             gw::detail::str("the shards and their gradients are on ", shards_on.str()));
}

}  // namespace gw::fsdp::testing
