#include "optim/grad_scaler.h"

#include <cmath>
#include <exception>
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
  if (!options_.enabled) return loss;
  // A 16-bit loss is scaled in float32: 65536 is already float16's infinity.
  return (is_16_bit_float(loss.dtype()) ? loss.to(kFloat32) : loss) * scale_;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& state = iteration_[&opt];
  GW_CHECK(!state.stepped, StateError,
           "[GradScaler] unscale_ after step: step() unscales, then update() ends the iteration");
  GW_CHECK(!state.unscaled, StateError,
           "[GradScaler] unscale_ was called on this optimizer already since the last update()");
  std::vector<Tensor> grads;
  for (const Tensor& p : opt.parameters()) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    // Checked on empty ones too, so that processes holding shards refuse alike.
    GW_CHECK(g.dtype() != kFloat16, InvalidArgumentError,
             "[GradScaler] cannot unscale float16 gradients (1 / scale may not be a float16): "
             "keep the parameters in float32 and let autocast compute in float16");
    if (g.numel() > 0) grads.push_back(g);
  }
  // From here the step is this unscale's: if it fails partway, the step is skipped rather than
  // taken on gradients of which some were divided.
  state.unscaled = true;
  state.found_inf = true;
  state.checked = !grads.empty();
  std::exception_ptr failed;
  try {
    autograd::NoGradGuard no_grad;
    const double inverse = 1.0 / scale_;
    std::vector<Tensor> checks;  // per gradient: 0, or NaN where an element is inf or NaN
    for (Tensor g : grads) {
      if (g.dtype() == kBFloat16)
        g.copy_(g.to(kFloat32) * inverse);  // the factor in float32, rounded once
      else
        g.mul_(inverse);
      checks.push_back((g * 0.0).sum().to(kFloat32).to(grads[0].device()));  // never overflows
    }
    state.found_inf = !checks.empty() && !std::isfinite(stack(checks).sum().item<double>());
  } catch (...) {
    failed = std::current_exception();
  }
  // A failure partway is agreed on too (agree may be the others' collective): they skip the
  // step with this one, which reports the first failure.
  try {
    agree(state.found_inf, state.checked);
  } catch (...) {
    if (!failed) throw;
  }
  if (failed) std::rethrow_exception(failed);
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
  GW_CHECK(state.checked, StateError,
           "[GradScaler] step: none of the optimizer's parameters has a gradient to check");
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

NamedTensors GradScaler::state_dict() const {
  return {{"scale", scalar_tensor(scale_, kFloat64)},
          {"growth_tracker", scalar_tensor(static_cast<double>(good_steps_), kFloat64)}};
}

void GradScaler::load_state_dict(const NamedTensors& state) {
  double values[2];
  const char* names[2] = {"scale", "growth_tracker"};
  for (int i = 0; i < 2; ++i) {
    auto it = state.find(names[i]);
    GW_CHECK(it != state.end() && it->second.numel() == 1, InvalidArgumentError,
             "[GradScaler] load_state_dict: no one-element \"", names[i], "\" in the state");
    values[i] = it->second.item<double>();
  }
  GW_CHECK(std::isfinite(values[0]) && values[0] > 0 && values[1] >= 0 &&
               values[1] < static_cast<double>(options_.growth_interval) &&
               values[1] == std::floor(values[1]),
           InvalidArgumentError, "[GradScaler] load_state_dict: scale ", values[0],
           " and growth_tracker ", values[1], " do not fit (growth_interval ",
           options_.growth_interval, ")");
  scale_ = values[0];
  good_steps_ = static_cast<int64_t>(values[1]);
}

}  // namespace gw::optim
