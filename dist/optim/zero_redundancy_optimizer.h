// gw::dist::ZeroRedundancyOptimizer — the optimizer's state sharded across the ranks of a group
// (ZeRO stage 1: Rajbhandari et al., SC 2020; torch.distributed.optim.ZeroRedundancyOptimizer).
//
// Mental model: every rank holds every parameter and, after DDP's backward, the same averaged
// gradients; so every rank would compute the same update, and keep the same state for it
// (Adam: two tensors per parameter). Instead, the parameters' elements, laid end to end, are
// cut into `world` equal ranges; each rank keeps the state of its range only and updates only
// those elements, with an ordinary optimizer over views of them. Then every range is broadcast
// from its rank, in place, so that every replica is whole again. The state takes 1/world of the
// memory on each rank; the cost is one broadcast per piece (a parameter's part of a range) a
// step, the same bytes as DDP's allreduce sends.
//
//   gw::ddp::DistributedDataParallel model(net, pg);
//   gw::dist::ZeroRedundancyOptimizer opt(model.module()->parameters(),
//                                         gw::optim::AdamOptions{.lr = 1e-3}, pg);
//   for (...) { opt.zero_grad(); loss(model.forward(x)).backward(); opt.step(); }
//   opt.consolidate_state_dict(0);  // every rank calls it
//   if (pg->rank() == 0) gw::save_safetensors("opt.safetensors", opt.state_dict());
//
// The consolidated state is the plain optimizer's ("state.<parameter>.<name>" shaped like the
// parameter, and "lr"), so it loads into a plain optimizer, and into a ZeroRedundancyOptimizer
// of any world size: each rank takes its range of it.
//
// Not a Joinable yet: inside a Join (dist/algorithms/join.h), a rank that joined would not take
// part in the others' broadcasts, and their step() would fail when the group's timeout passes.
//
// PyTorch splits by whole parameters (largest first), which leaves one rank with most of the
// state when one parameter dominates (the 13.7M-parameter MLP's 2560 x 4096 weight is 77% of
// it); element ranges split any model evenly, and every optimizer gradwire has works element by
// element.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/serialize.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/process_group/process_group.h"
#include "optim/factory.h"

namespace gw::dist {

class ZeroRedundancyOptimizer {
 public:
  // A collective: every rank of `group` passes parameters of the same shapes and dtypes (else
  // every rank raises InvalidArgumentError naming the first that differs) and the same options.
  // Parameters must be contiguous floating point leaves.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const optim::OptimizerOptions& options,
                          std::shared_ptr<ProcessGroup> group);

  // A collective: updates this rank's range from the parameters' .grad (a parameter without one
  // is skipped, as by the plain optimizer), then every rank's range reaches every rank.
  void step();
  void zero_grad();  // every parameter's .grad to none, as the plain optimizer's

  const std::vector<Tensor>& parameters() const { return params_; }
  double lr() const { return lr_; }
  void set_lr(double lr);
  // The bytes of optimizer state this rank holds (its range's).
  int64_t state_bytes() const;

  // A collective: gathers every rank's state on rank `to`, where state_dict() then returns it.
  void consolidate_state_dict(int to = 0);
  // On rank `to` after consolidate_state_dict(to) (and no step since): the whole state, as the
  // plain optimizer's state_dict. Elsewhere a StateError says so.
  NamedTensors state_dict() const;
  // The whole state (the plain optimizer's, or a consolidated one of any world size); each rank
  // keeps its range. Checked before anything changes; errors name the key.
  void load_state_dict(const NamedTensors& state);

  // For a distributed checkpoint (dist/checkpoint/dist_checkpoint.h): this rank's ranges of the
  // plain optimizer's state ("<prefix>state.<parameter>.<name>" for the whole parameter's
  // shape, each range at its offset; step counts and "<prefix>lr" whole), so that each rank
  // writes only what it holds and the checkpoint holds the plain optimizer's state_dict.
  checkpoint::ShardedState sharded_state_dict(const std::string& prefix = "") const;
  // A collective: each rank reads its ranges of "<prefix>..." from a checkpoint saved at any
  // world size (by a ZeroRedundancyOptimizer or from a plain optimizer's state), and only those.
  // An error on any rank raises on every rank before any rank changed: a missing key, another
  // shape, a file that cannot be read, a state name or step count this kind of optimizer does
  // not take.
  void load_state_dict(const checkpoint::Reader& checkpoint, const std::string& prefix = "");

  // A parameter's elements [offset, offset + length) and the rank that owns them.
  struct Piece {
    size_t param = 0;
    int64_t offset = 0, length = 0;
    int owner = 0;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  std::vector<Tensor> params_;
  std::shared_ptr<ProcessGroup> group_;
  double lr_;
  std::vector<Piece> pieces_;  // every rank's, in parameter order: the broadcasts' order
  std::vector<Tensor> views_;  // pieces_[k]'s elements: flat views of the parameter's storage
  std::vector<size_t> mine_;   // indices into pieces_ of this rank's, in order
  std::unique_ptr<optim::Optimizer> local_;  // over views_[mine_...]; null if this rank owns none
  std::optional<NamedTensors> consolidated_;
};

}  // namespace gw::dist
