// gw::ddp::DistributedDataParallel — data-parallel training of an nn::Module
// (torch.nn.parallel.DistributedDataParallel; PyTorch's DDP design note,
// pytorch.org/docs/stable/notes/ddp.html, and Li et al., VLDB 2020, arxiv.org/abs/2006.15704).
//
// Mental model: every rank holds a replica of the model and trains it on its own shard of each
// batch. At construction DDP checks that every rank's parameters have the same shapes and
// copies rank 0's parameters and buffers to the others. In backward, the Reducer (reducer.h)
// averages the gradients across ranks bucket by bucket while backward still runs, so after
// loss.backward() every rank holds the same averaged `.grad`, and identical optimizer steps
// keep the replicas identical.
//
//   auto pg = gw::dist::init_process_group("gloo", "env://", rank, world_size);
//   gw::ddp::DistributedDataParallel model(make_mlp(), pg);
//   gw::optim::SGD opt(model.module()->parameters(), {.lr = 0.02});
//   for (auto [x, y] : my_shard) {
//     opt.zero_grad();
//     gw::nn::functional::cross_entropy(model.forward(x), y).backward();  // averaged here
//     opt.step();
//   }
#pragma once

#include <memory>

#include "ddp/reducer.h"
#include "dist/algorithms/join.h"
#include "dist/process_group/process_group.h"
#include "nn/module.h"

namespace gw::ddp {

struct DDPOptions {
  double bucket_cap_mb = 25;        // later buckets; the first one is capped at 1 MiB
  double first_bucket_cap_mb = 1;
  bool broadcast_buffers = true;  // rank 0's buffers (see Join below) to every rank, each forward
  // Parameters the output does not depend on count as ready instead of stalling the reduction
  // (their gradient is averaged with zeros, and left as it is when no rank used them since the
  // last synced step); costs a graph traversal per forward.
  bool find_unused_parameters = false;
  // .grad of each parameter becomes a view into its bucket (saves a copy and the memory of a
  // second set of gradients). As in PyTorch, zero_grad() dropping .grad undoes it until the
  // parameter's next reduction. Over a group that reduces .grad in place (the Gloo group
  // through shared memory: see Reducer), where there is no copy to save, it costs a division
  // pass, and a copy wherever .grad is not yet the bucket's.
  bool gradient_as_bucket_view = false;
  // The module uses the same parameters, the same number of times, every iteration (PyTorch's
  // static_graph). The first backward counts how often each parameter's gradient hook fires
  // and reduces at its end; later ones reduce each parameter after that many firings. So a
  // parameter may be used more than once per backward in the way that fires its hook twice (by
  // a reentrant autograd::checkpoint and outside it), which otherwise fails with "Expected to
  // mark a variable ready only once"; and parameters the first iteration did not use are marked
  // ready without find_unused_parameters' graph traversal per forward (find_unused_parameters
  // is then ignored). Not inside a Join yet.
  bool static_graph = false;
};

// A Joinable (dist/algorithms/join.h): inside a Join, a rank that ran out of data shadows the
// others' forward (the buffer broadcast) and backward (an allreduce of zeros per bucket, through
// the comm hook; the used-parameter map) until every rank has joined; then every rank takes the
// parameters and buffers of a rank that joined last. Buffers come from the lowest rank still
// training (rank 0 without a Join). Inside a Join, a forward with grad enabled and outside
// no_sync must be followed by its backward before the next forward (the joined ranks shadow
// one backward per such forward): run evaluation under NoGradGuard.
class DistributedDataParallel : public dist::Joinable {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<dist::ProcessGroup> group, DDPOptions options = {});

  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const Reducer& reducer() const { return *reducer_; }
  // Replaces the averaging allreduce of each bucket (before the first backward pass).
  void register_comm_hook(CommHook hook) { reducer_->set_comm_hook(std::move(hook)); }

  // Forward passes made within its scope are not reduced in their backward: gradients
  // accumulate locally (gradient accumulation) until a backward of a forward made outside it
  // averages everything accumulated. Guards nest.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.reducer_->sync()) {
      ddp_.reducer_->set_sync(false);
    }
    ~NoSync() { ddp_.reducer_->set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  std::unique_ptr<dist::JoinHook> join_hook(const dist::JoinOptions& options) override;
  std::shared_ptr<dist::ProcessGroup> join_process_group() const override { return group_; }

 private:
  class JoinHook;
  void broadcast_from(int root, const std::vector<Tensor>& tensors);
  // Inside a Join: whether any rank's backward of this iteration reduces (a joined rank says
  // no), so that the joined ranks know whether to shadow it.
  bool any_rank_reduces(bool mine);
  // Inside a Join: what the gradients of `iteration` are divided by (the same on every rank:
  // it decides which collectives the backward makes).
  int divisor_in(const dist::JoinIteration& iteration) const;

  // Inside a Join (join_id() == due_in_join_): the backward the last forward announced has not
  // ended yet if the reducer's count of ended backwards is still backwards_at_forward_.
  uint64_t due_in_join_ = 0;
  int64_t backwards_at_forward_ = 0;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<dist::ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace gw::ddp
