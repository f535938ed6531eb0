#include "optim/lr_scheduler.h"

#include <cmath>
#include <numbers>

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

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor, int64_t last_epoch,
                   std::optional<double> base_lr)
    : optimizer_(optimizer),
      factor_(std::move(factor)),
      base_lr_(base_lr.value_or(optimizer.lr())) {
  GW_CHECK(factor_ != nullptr, InvalidArgumentError, "[LambdaLR] no factor function given");
  GW_CHECK(last_epoch >= 0, InvalidArgumentError, "[LambdaLR] last_epoch must be >= 0, got ",
           last_epoch);
  // Resumed, the optimizer's lr is a scheduled one already: scaling it again would be wrong.
  GW_CHECK(last_epoch == 0 || base_lr.has_value(), InvalidArgumentError,
           "[LambdaLR] resuming at step ", last_epoch,
           " needs the base lr the schedule started from");
  detail::check_at_least("LambdaLR", "base_lr", base_lr_);
  apply(last_epoch);
}

void LambdaLR::step() { apply(last_epoch_ + 1); }

// Sets the lr for `epoch` and makes it the last one, or throws with nothing changed.
void LambdaLR::apply(int64_t epoch) {
  const double f = factor_(epoch);
  GW_CHECK(f >= 0 && std::isfinite(f), InvalidArgumentError, "[LambdaLR] the factor at step ",
           epoch, " is ", f, "; it must be finite and non-negative");
  optimizer_.set_lr(base_lr_ * f);
  last_epoch_ = epoch;
}

std::function<double(int64_t)> warmup_cosine(int64_t warmup_steps, int64_t total_steps,
                                             double min_factor) {
  GW_CHECK(warmup_steps >= 0 && total_steps > warmup_steps, InvalidArgumentError,
           "[warmup_cosine] needs 0 <= warmup_steps < total_steps, got ", warmup_steps, " and ",
           total_steps);
  GW_CHECK(min_factor >= 0 && min_factor <= 1, InvalidArgumentError,
           "[warmup_cosine] min_factor must be in [0, 1], got ", min_factor);
  return [=](int64_t step) {
    if (step < warmup_steps)
      return static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
    if (step >= total_steps) return min_factor;
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return min_factor + (1 - min_factor) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
  };
}

}  // namespace gw::optim
