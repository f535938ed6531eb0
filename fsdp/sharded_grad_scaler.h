// gw::fsdp::ShardedGradScaler — loss scaling (optim/grad_scaler.h) for gradients spread over
// ranks: PyTorch's ShardedGradScaler. Under fully_shard each rank unscales only its shards'
// gradients, so an inf on one rank would skip that rank's step and let the others take theirs,
// and the shards would drift apart. Here every rank's unscale_ ends in one allreduce of what it
// found, so every rank skips the step, and backs the scale off, together.
//
//   gw::fsdp::ShardedGradScaler scaler(group);
//   scaler.scale(model->loss(x, y)).backward();   // under a float16 autocast or policy
//   scaler.step(opt);                             // on every rank alike
//   scaler.update();
//
// Every rank of the group calls unscale_ (or step) for the same optimizers in the same order,
// with the scaler enabled alike. A rank whose shards hold no gradient at all takes part and
// steps with the others; a rank whose unscale fails partway throws, and the others skip the
// step with it.
#pragma once

#include <memory>

#include "dist/process_group/process_group.h"
#include "optim/grad_scaler.h"

namespace gw::fsdp {

class ShardedGradScaler final : public optim::GradScaler {
 public:
  explicit ShardedGradScaler(std::shared_ptr<dist::ProcessGroup> group,
                             optim::GradScalerOptions options = {});

 protected:
  void agree(bool& found_inf, bool& checked) override;

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
};

}  // namespace gw::fsdp
