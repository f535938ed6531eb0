#include "optim/lr_scheduler.h"

#include "optim/check.h"

namespace gw::optim {

StepLR::StepLR(Optimizer& optimizer, const StepLROptions& options)
    : optimizer_(optimizer), options_(options) {
  GW_CHECK(options.step_size > 0, InvalidArgumentError,
           "[StepLR] invalid step_size: ", options.step_size, " (must be > 0)");
  detail::check_at_least("StepLR", "gamma", options.gamma);
}

void StepLR::step() {
  ++last_epoch_;
  if (last_epoch_ % options_.step_size == 0) optimizer_.set_lr(optimizer_.lr() * options_.gamma);
}

}  // namespace gw::optim
