#include "fsdp/sharded_grad_scaler.h"

#include "core/error.h"
#include "core/ops.h"

namespace gw::fsdp {

ShardedGradScaler::ShardedGradScaler(std::shared_ptr<dist::ProcessGroup> group,
                                     optim::GradScalerOptions options)
    : optim::GradScaler(options), group_(std::move(group)) {
  GW_CHECK(group_ != nullptr, InvalidArgumentError,
           "[ShardedGradScaler] the process group is null");
}

void ShardedGradScaler::agree(bool& found_inf, bool& checked) {
  // One allreduce of two flags: an inf anywhere, and a gradient anywhere.
  Tensor flags = from_vector(std::vector<float>{found_inf ? 1.f : 0.f, checked ? 1.f : 0.f}, {2})
                     .to(group_->device());
  group_->allreduce(flags, {.op = dist::ReduceOp::MAX})->wait();
  const std::vector<float> all = flags.to(kCPU).to_vector<float>();
  found_inf = all[0] > 0;
  checked = all[1] > 0;
}

}  // namespace gw::fsdp
