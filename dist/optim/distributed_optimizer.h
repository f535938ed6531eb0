// gw::dist::DistributedOptimizer (torch.distributed.optim.DistributedOptimizer).
//
// Mental model ("Distributed Optimizer" in pytorch.org/docs/stable/rpc/distributed_autograd.html):
// it takes RRefs to parameters, remote or local, and optimizer options. For every distinct owner it
// creates, over RPC, one local optimizer of that kind on the owner over the parameters it owns, and
// keeps an RRef to it. step(context_id) runs all of them at once, each with the gradients that
// distributed autograd accumulated on its worker in that context, and waits. Steps of several
// distributed optimizers on one worker are serialized by a lock there. Its state (which PyTorch's
// cannot give) is every owner's optimizer state, fetched over RPC, with keys prefixed by the
// owner's name ("ps/state.0.momentum_buffer"), so a checkpoint can hold it and a restarted job load
// it.
//
//   gw::dist::DistributedOptimizer opt(gw::optim::SGD::options(0.05), {rref1, rref2});
//   opt.step(ctx.id());
//   gw::NamedTensors state = opt.state_dict();   // ... later, in a new job:
//   opt.load_state_dict(state);
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/serialize.h"
#include "dist/step_lock.h"
#include "optim/factory.h"
#include "rpc/rref.h"

namespace gw::dist {

// Registers the functions a DistributedOptimizer calls on the parameters' owners
// ("dist.LocalOptimizer.*"); once per process, however often it is called. Every agent started
// by dist::init_rpc does it (dist/init_rpc.h), since an owner may never make a
// DistributedOptimizer itself.
void register_local_optimizer();

// The worker-side optimizer (PyTorch's _LocalOptimizer).
class LocalOptimizer {
 public:
  LocalOptimizer(const optim::OptimizerOptions& options, std::vector<Tensor> params);
  // Applies this worker's gradients of `context_id`.
  void step(int64_t context_id);
  // The optimizer's state_dict / load_state_dict, under the step lock.
  NamedTensors state_dict();
  void load_state_dict(NamedTensors state);

 private:
  std::unique_ptr<optim::Optimizer> optimizer_;
};

class DistributedOptimizer {
 public:
  DistributedOptimizer(const optim::OptimizerOptions& options,
                       const std::vector<rpc::RRef<Tensor>>& params);
  // Steps every owner's optimizer with the gradients of `context_id`; throws the first error.
  void step(uint64_t context_id);
  // Every owner's optimizer state, keys prefixed by "<owner name>/" (optim::Optimizer's keys
  // after it); fetched from the owners at once.
  NamedTensors state_dict() const;
  // Loads a state_dict() of an optimizer over the same parameters: every owner's part must be
  // there; a key of no owner throws InvalidArgumentError naming it before anything changes.
  // Each owner then checks its part as optim::Optimizer::load_state_dict does: a part it
  // rejects changes nothing there, but the other owners have loaded theirs.
  void load_state_dict(const NamedTensors& state);

 private:
  std::vector<rpc::RRef<std::shared_ptr<LocalOptimizer>>> optimizers_;
};

}  // namespace gw::dist

// Optimizer options travel to the owners as bytes: the variant's index and the options struct
// (every worker runs the same program, so the layout is the same).
template <>
struct gw::rpc::Serializer<gw::optim::OptimizerOptions> {
  static std::vector<uint8_t> serialize(const gw::optim::OptimizerOptions& o);
  static gw::optim::OptimizerOptions deserialize(std::span<const uint8_t> bytes);
};
