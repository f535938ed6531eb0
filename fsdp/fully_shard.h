// gw::fsdp::fully_shard — fully sharded data parallelism (PyTorch's FSDP2 `fully_shard`;
// ZeRO stage 3, Rajbhandari et al., arxiv.org/abs/1910.02054).
//
// Mental model: DDP keeps a whole copy of the parameters, their gradients and the optimizer's
// state on every rank; fully_shard keeps 1/world of each. Every parameter is cut along dim 0
// into one shard per rank (the last ranks' may be shorter, or empty; the padding that makes
// the pieces equal never shows). A *unit* is a module given to fully_shard:
// - its call gathers its parameters from every rank into one buffer that its members view,
//   and frees them after the call (reshard_after_forward);
// - its backward gathers them again, and when it ends reduce-scatters their gradients, so that
//   each rank keeps the average gradient of its own shard in the shard's .grad;
// - the module's parameters() become the shards, so any optimizer steps on them unchanged.
//
//   auto model = std::make_shared<gw::nn::GPT>(options, gen);   // the same init on every rank
//   for (auto& block : model->h->children()) gw::fsdp::fully_shard(block, pg);  // one per block
//   gw::fsdp::fully_shard(model, pg);          // the root: embeddings, final norm, head
//   gw::optim::AdamW opt(model->parameters(), {.lr = 1e-3});   // the shards
//   for (auto [x, y] : my_batches) {
//     opt.zero_grad();
//     model->loss(x, y).backward();   // gathers, computes, reduce-scatters, unit by unit
//     opt.step();                     // on this rank's shards
//   }
//
// Overlap: collectives run on the group's thread. The first iteration records the order in
// which units are called and run backward; from then on a unit's call issues the next unit's
// all-gather before it computes, and its backward the previous unit's, so with
// reshard_after_forward at most two units besides the root are gathered at once.
// Reduce-scatters run while earlier units' backward computes; the end of backward waits for
// them and makes each shard's .grad a view of its reduction (or adds to a .grad already there,
// as autograd does).
//
// Rules, as PyTorch's:
// - Call units through operator(), where their hooks run (model->loss and GPT's own calls do);
//   the first unit called is the root, and owns the units below it. The root keeps its own
//   parameters gathered from its call to the end of backward (its backward comes first).
// - Every rank calls the same units in the same order, as every rank runs the same collectives.
//   A unit whose backward no rank reached still takes part in the reduction at the end. Ranks
//   that call different units fail on every rank with InvalidArgumentError: each collective
//   carries a tag naming its unit, which every rank compares (gathers on CPU groups only).
// - Ranks start from the same parameters (same seed): each keeps its own rows of its own copy.
// - A parameter belongs to one unit: one that two units share is refused, as are a module
//   given to fully_shard twice and a unit made below one that exists (shard blocks first).
// - Shard on the group's device, in the training dtype: a shard moved afterwards is refused.
//   The shards stay there, or go to host memory under a CPUOffloadPolicy.
// - The module's state_dict() lists this rank's shards; FSDPModule's sharded_state_dict (for
//   gw::dist::checkpoint, loadable at any world size) and full_state_dict are the forms to save.
// - A unit may be called under autograd::checkpoint (a block's call, as
//   `autograd::checkpoint([&](const Tensor& x) { return (*block)(x); }, h)`): its first call,
//   without grad, frees the parameters after it; the recomputation inside backward gathers
//   them as the unit's backward does and keeps them for it, so a step gathers each unit as
//   often as without checkpointing.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/process_group/process_group.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace gw::dist {
class DeviceMesh;
}

namespace gw::fsdp {

namespace detail {
struct Unit;
}

// FSDP2's MixedPrecisionPolicy: the shards (the optimizer's master weights) keep their dtype;
// a unit's parameters are gathered and computed in param_dtype, and its gradients reduced in
// reduce_dtype (default: param_dtype) and stored on the shards in the shards' dtype. E.g.
// bfloat16 compute over float32 master weights, reductions in float32. Each unit casts its
// floating input to its param_dtype when one is given (cast_forward_inputs), and its floating
// output to output_dtype when one is given, so that units of different policies compose: e.g.
// the blocks in bfloat16 with output_dtype float32 under a root that computes in float32. On the
// CPU, 16-bit compute runs through float32 copies, rounded as on a GPU
// (core/cpu/half_as_float.h).
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype = std::nullopt;
  std::optional<DType> reduce_dtype = std::nullopt;
  std::optional<DType> output_dtype = std::nullopt;
  bool cast_forward_inputs = true;
};

// FSDP2's CPUOffloadPolicy, for models whose shards and optimizer state do not fit the GPU: the
// shards, their gradients and so the optimizer's state live in host memory, and the optimizer
// steps there; the GPU holds only the units gathered at the moment and the activations. A
// unit's gather copies its shards to the group's device first, and its reduction copies this
// rank's averaged rows back. pin_memory: shards in page-locked memory, which those copies read
// and write directly. With a CPU group (Gloo, MPI) the shards are in host memory anyway and the
// policy changes nothing.
//
//   gw::fsdp::fully_shard(block, nccl, {.offload_policy = gw::fsdp::CPUOffloadPolicy{}});
struct CPUOffloadPolicy {
  bool pin_memory = true;
};

struct FullyShardOptions {
  // Free the gathered parameters after the unit's call and gather them again for its backward;
  // false keeps them from the call to the end of backward (less traffic, more memory). The
  // root keeps its own either way; without grad mode every unit frees them after its call.
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy = {};
  std::optional<CPUOffloadPolicy> offload_policy = std::nullopt;
  // HSDP (FSDP2's fully_shard over a 2-D DeviceMesh ("replicate", "shard"); the DeviceMesh
  // overload below sets it): the unit is sharded over its group and replicated over this one,
  // the ranks that hold the same rows (e.g. the shards within each host, a replica per host).
  // Gathers stay within the shard group; each reduction's sums are then summed over the
  // replicas too, so that every replica's shards take the average over all of them. Every rank
  // of this group must hold the same place in its shard group. nullptr: one replica.
  std::shared_ptr<dist::ProcessGroup> replicate_group = nullptr;
};

// What fully_shard returns (FSDP2's FSDPModule): the unit's handle. Dropping it changes
// nothing: the module's hooks keep the unit.
class FSDPModule {
 public:
  FSDPModule(std::shared_ptr<detail::Unit> unit, std::shared_ptr<nn::Module> module)
      : unit_(std::move(unit)), module_(std::move(module)) {}

  // Gathers this unit's parameters now (to read the members outside a call), or frees them.
  void unshard();
  void reshard();
  // false: backward keeps whole gradients and adds to them, with no communication; the next
  // backward with sync reduce-scatters the sum (gradient accumulation, DDP's no_sync). They
  // stay on the members, or, where the policy's reduce_dtype differs from the dtype the unit
  // computes in (param_dtype, or the shards'), are summed apart in reduce_dtype, as FSDP2 does:
  // bfloat16 micro-batch gradients summed in float32, which holds a whole float32 copy of the
  // unit's gradients between steps. `recurse` applies it to the units below this one too.
  void set_requires_gradient_sync(bool sync, bool recurse = true);
  // false: backward leaves the parameters gathered, so that the next forward (the next
  // micro-batch of gradient accumulation) gathers nothing, for a whole copy of the unit in
  // memory meanwhile (FSDP2's; with reshard_after_forward false, a unit is then gathered once
  // per step). A unit kept so is gathered again when its shards have changed since (an
  // optimizer step, a load): forgetting to set it back costs memory, never a stale parameter.
  // Every rank sets it alike.
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  // HSDP (FSDP2's): false keeps each backward's reduce-scattered sums in this replica (rows and
  // counts in reduce_dtype, one shard's worth) instead of summing them over the replicas; the
  // next backward with it true adds them to its own before that sum. Gradient accumulation
  // across hosts then sends one all-reduce a step, not one a micro-batch, while the shard
  // groups still reduce-scatter each micro-batch (no whole gradients in memory, as
  // set_requires_gradient_sync(false) keeps). The .grad of the shards changes only at that
  // last backward: set it back before the optimizer step. Every rank sets it alike (ranks that
  // differ, within a shard group or across replicas, all fail at the end of backward); without
  // replicas it changes nothing.
  void set_requires_all_reduce(bool all_reduce, bool recurse = true);
  // This unit's shards, as the module's parameters() lists them (in order, each once).
  std::vector<Tensor> shards() const;
  const std::shared_ptr<dist::ProcessGroup>& group() const;

  // --- checkpoints (through gw::dist::checkpoint; every rank calls these) -----------------
  // The module's state as this rank holds it: each parameter's shard as its rows of the whole
  // tensor, each buffer whole, named "<prefix><name>". dcp::save writes each rank's rows;
  // dcp::load(ckpt, sharded_state_dict(prefix), group) fills the shards in place at any world
  // size (each rank reads its rows now), or changes nothing when any rank cannot load. Under
  // HSDP, save and load over the whole job's group (the replicas' equal rows are written once).
  dist::checkpoint::ShardedState sharded_state_dict(const std::string& prefix = "") const;
  // An optimizer's state over this module's parameters (in parameters() order), likewise:
  // "<prefix>state.<i>.<name>" as rows of the parameter's whole shape, step counts and "lr"
  // whole.
  dist::checkpoint::ShardedState sharded_optimizer_state(const optim::Optimizer& optimizer,
                                                         const std::string& prefix = "") const;
  // Reads that state for this rank's rows from `checkpoint` into `optimizer` (a collective
  // over the unit's ranks, replicas included: when any rank cannot, every rank throws and no
  // optimizer changed).
  void load_optimizer_state(optim::Optimizer& optimizer, const dist::checkpoint::Reader& checkpoint,
                            const std::string& prefix = "") const;
  // Every parameter whole (its shards gathered unit by unit, in the shards' dtype, on their
  // device) and every buffer, by the module's state_dict names, on every rank: PyTorch's full state
  // dict (save it from rank 0).
  NamedTensors full_state_dict() const;

 private:
  // `flag` of this unit set to `value`, and of the units below it with `recurse`.
  void set_flag(bool detail::Unit::*flag, bool value, bool recurse);
  std::shared_ptr<detail::Unit> unit_;
  std::shared_ptr<nn::Module> module_;  // the unit's module outlives this handle
};

// clip_grad_norm_ over shards (torch.nn.utils.clip_grad_norm_ on FSDP's DTensors): the total
// 2-norm of every rank's shard gradients (one allreduce of a number), and each rank scales its
// own by max_norm / (norm + 1e-6), clamped to 1. Returns the total norm from before. Every rank
// of `group` calls it.
double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm,
                       dist::ProcessGroup& group);
// The same over ranks that several groups reach together, e.g. a pipeline's stages sharded over
// their replicas: the sum goes over each group in turn (a DeviceMesh's "pp" then "dp"), which
// must reach every rank once through the product of the groups.
double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm,
                       const std::vector<dist::ProcessGroup*>& groups);

// Makes `module` a unit over `group` (Gloo, MPI or NCCL; every rank calls it the same way).
// The unit manages the parameters of `module` and its descendants, except those of descendants
// that are units already (shard the blocks first, then the root). Checks on every rank that
// the ranks' parameters have the same count, shapes and dtypes, in order (InvalidArgumentError
// on every rank otherwise, naming the parameter; names are not compared, so every rank must
// shard its units in the same order); a module sharded already, a parameter another unit
// holds, or parameters of more than one dtype in a unit: InvalidArgumentError, on every rank
// at once when one rank finds it (the others naming that rank). A parameter frozen
// (requires_grad_(false)) or unfrozen later, through parameters() (the shards) or through the
// module's member, is so from the next forward on (a backward already recorded still gives it
// its gradient, as without sharding); freeze alike on every rank.
std::shared_ptr<FSDPModule> fully_shard(const std::shared_ptr<nn::Module>& module,
                                        std::shared_ptr<dist::ProcessGroup> group,
                                        FullyShardOptions options = {});
// The same over a DeviceMesh, as FSDP2 takes one: 1-D, its group; 2-D (replicate, shard), HSDP:
// sharded over the mesh's second dimension and replicated over its first (replicate_group,
// which `options` must then leave unset).
//   auto mesh = gw::dist::init_device_mesh({hosts, gpus_per_host}, {"replicate", "shard"});
//   for (auto& block : model->h->children()) gw::fsdp::fully_shard(block, mesh);
//   gw::fsdp::fully_shard(model, mesh);
std::shared_ptr<FSDPModule> fully_shard(const std::shared_ptr<nn::Module>& module,
                                        const dist::DeviceMesh& mesh,
                                        FullyShardOptions options = {});

}  // namespace gw::fsdp
