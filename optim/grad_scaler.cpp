#include "optim/grad_scaler.h"

#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::optim {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  GW_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0, InvalidArgumentError,
           "[GradScaler] init_scale must be positive and finite, got ", options.init_scale);
  GW_CHECK(options.growth_factor > 1 && std::isfinite(options.growth_factor), InvalidArgumentError,
           "[GradScaler] growth_factor must be above 1, got ", options.growth_factor);
  GW_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1, InvalidArgumentError,
           "[GradScaler] backoff_factor must be in (0, 1), got ", options.backoff_factor);
  GW_CHECK(options.growth_interval > 0, InvalidArgumentError,
           "[GradScaler] growth_interval must be positive, got ", options.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  return options_.enabled ? loss * scale_ : loss;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& state = iteration_[&opt];
  GW_CHECK(!state.unscaled, StateError,
           "[GradScaler] unscale_ was called on this optimizer already since the last update()");
  GW_CHECK(!state.stepped, StateError,
           "[GradScaler] unscale_ after step: step() unscales, then update() ends the iteration");
  autograd::NoGradGuard no_grad;
  const double inverse = 1.0 / scale_;
  std::vector<Tensor> sums;  // each gradient's sum: inf or NaN if any element is
  for (const Tensor& p : opt.parameters()) {
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    g.mul_(inverse);
    sums.push_back(g.sum().to(kFloat64).to(opt.parameters()[0].device()));
  }
  state.unscaled = true;
  state.found_inf = !sums.empty() && !std::isfinite(stack(sums).sum().item<double>());
}

bool GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  PerOptimizer& state = iteration_[&opt];
  GW_CHECK(!state.stepped, StateError,
           "[GradScaler] step was called on this optimizer already since the last update()");
  if (!state.unscaled) unscale_(opt);
  state.stepped = true;
  if (state.found_inf) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  GW_CHECK(!iteration_.empty(), StateError,
           "[GradScaler] update() without an unscale_ or step since the last one");
  bool found_inf = false;
  for (const auto& [opt, state] : iteration_) found_inf = found_inf || state.found_inf;
  iteration_.clear();
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    good_steps_ = 0;
  } else if (++good_steps_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    good_steps_ = 0;
  }
}

}  // namespace gw::optim
