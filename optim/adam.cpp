#include "optim/adam.h"

#include <algorithm>
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

std::vector<ParamUpdate> fused_adam(std::vector<ParamUpdate>& updates, const AdamUpdate& u,
                                    double lr, const std::function<NamedTensors&(size_t)>& state_of,
                                    const std::function<double(NamedTensors&)>& count_step) {
  std::vector<ParamUpdate> rest;
  std::vector<std::vector<AdamParam>> groups;  // one per device and dtype
  for (ParamUpdate& up : updates) {
    const Tensor& p = up.param;
    NamedTensors& st = state_of(up.index);
    // The kernel takes contiguous tensors of the parameter's dtype and device; state loaded
    // from elsewhere that is not (yet) so goes the op-by-op way.
    bool fusable = backend_for(p, "adam").has_fused_adam() && p.is_contiguous();
    for (const char* name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
      auto it = st.find(name);
      if (it != st.end()) {
        const Tensor& t = it->second;
        fusable &= t.is_contiguous() && t.dtype() == p.dtype() && t.device() == p.device();
      }
    }
    if (!fusable) {
      rest.push_back(up);
      continue;
    }
    const double step = count_step(st);
    AdamParam a{.param = p,
                .grad = up.grad.contiguous(),
                .exp_avg = state_or_zeros(st, "exp_avg", p),
                .exp_avg_sq = state_or_zeros(st, "exp_avg_sq", p),
                .max_exp_avg_sq = u.amsgrad ? state_or_zeros(st, "max_exp_avg_sq", p) : Tensor(),
                .step_size = lr / (1 - std::pow(u.beta1, step)),
                .bias_correction2_sqrt = std::sqrt(1 - std::pow(u.beta2, step))};
    auto group = std::find_if(groups.begin(), groups.end(), [&p](const auto& g) {
      return g.front().param.device() == p.device() && g.front().param.dtype() == p.dtype();
    });
    if (group == groups.end()) group = groups.emplace(groups.end());
    group->push_back(std::move(a));
  }
  for (const auto& group : groups) {
    backend_for(group.front().param, "adam").adam_step(group, u);
    // As the op-by-op update's in-place ops do: a graph that saved one of these sees the change.
    for (const AdamParam& a : group) {
      for (const Tensor* t : {&a.param, &a.exp_avg, &a.exp_avg_sq, &a.max_exp_avg_sq}) {
        if (t->defined()) t->bump_version();
      }
    }
  }
  return rest;
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

void Adam::apply(std::vector<ParamUpdate>& updates) {
  auto rest = detail::fused_adam(
      updates, detail::fused_settings(options_, lr_, /*decoupled=*/false), lr_,
      [this](size_t i) -> NamedTensors& { return state(i); },
      [](NamedTensors& st) { return increment_step(st); });
  for (ParamUpdate& r : rest) update(r.index, r.param, r.grad);
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
