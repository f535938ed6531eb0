#include "optim/adam.h"

#include <cmath>

#include "core/ops.h"
#include "optim/adam_step.h"
#include "optim/check.h"

namespace gw::optim {

namespace detail {

namespace {
Tensor& state_or_zeros(NamedTensors& state, const char* name, const Tensor& param) {
  auto it = state.find(name);
  if (it == state.end()) it = state.emplace(name, zeros_like(param)).first;
  return it->second;
}
}  // namespace

void adam_step(NamedTensors& state, Tensor& param, const Tensor& grad, const AdamStep& h) {
  Tensor& exp_avg = state_or_zeros(state, "exp_avg", param);
  Tensor& exp_avg_sq = state_or_zeros(state, "exp_avg_sq", param);
  exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
  exp_avg_sq.mul_(h.beta2).add_(mul(grad, grad), 1 - h.beta2);

  // Bias corrections in double, as torch computes them with Python floats.
  double bias_correction1 = 1 - std::pow(h.beta1, h.step);
  double bias_correction2 = 1 - std::pow(h.beta2, h.step);
  double step_size = h.lr / bias_correction1;
  double bias_correction2_sqrt = std::sqrt(bias_correction2);

  Tensor second = exp_avg_sq;
  if (h.amsgrad) {
    Tensor& max_sq = state_or_zeros(state, "max_exp_avg_sq", param);
    max_sq.copy_(maximum(max_sq, exp_avg_sq));
    second = max_sq;
  }
  Tensor denom = sqrt(second).div_(bias_correction2_sqrt).add_(h.eps);
  param.add_(div(exp_avg, denom), -step_size);
}

std::vector<std::string> adam_state_names(bool amsgrad) {
  std::vector<std::string> names = {"step", "exp_avg", "exp_avg_sq"};
  if (amsgrad) names.push_back("max_exp_avg_sq");
  return names;
}

}  // namespace detail

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Optimizer(std::move(params), "Adam"), options_(options) {
  detail::check_adam_options("Adam", options);
  lr_ = options.lr;
}

std::vector<std::string> Adam::state_names() const {
  return detail::adam_state_names(options_.amsgrad);
}

void Adam::update(size_t index, Tensor& param, const Tensor& grad) {
  const AdamOptions& o = options_;
  NamedTensors& st = state(index);
  double step = increment_step(st);
  Tensor g = o.maximize ? neg(grad) : grad;
  if (o.weight_decay != 0) g = add(g, param, o.weight_decay);
  detail::adam_step(st, param, g, detail::adam_settings(o, lr_, step));
}

}  // namespace gw::optim
