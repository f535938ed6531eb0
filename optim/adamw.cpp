#include "optim/adamw.h"

#include <algorithm>

#include "core/ops.h"
#include "optim/adam_step.h"
#include "optim/check.h"

namespace gw::optim {

namespace {

std::vector<Tensor> flatten(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> params;
  for (const ParamGroup& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(const std::vector<Tensor>& params,
                                            double weight_decay) {
  ParamGroup decay{.params = {}, .weight_decay = weight_decay};
  ParamGroup no_decay{.params = {}, .weight_decay = 0.0};
  for (const Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {std::move(decay), std::move(no_decay)};
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{{.params = std::move(params), .weight_decay = {}}}, options) {}

AdamW::AdamW(const std::vector<ParamGroup>& groups, const AdamWOptions& options)
    : Optimizer(flatten(groups), "AdamW"), options_(options) {
  detail::check_adam_options("AdamW", options);
  for (const ParamGroup& g : groups) {
    const double decay = g.weight_decay.value_or(options.weight_decay);
    detail::check_at_least("AdamW", "weight_decay", decay);
    decay_.insert(decay_.end(), g.params.size(), decay);
  }
  lr_ = options.lr;
}

std::vector<std::string> AdamW::state_names() const {
  return detail::adam_state_names(options_.amsgrad);
}

void AdamW::apply(std::vector<ParamUpdate>& updates) {
  // The fused kernel takes one weight decay a launch: the updates go to it by decay.
  std::vector<double> decays;
  for (const ParamUpdate& u : updates)
    if (std::find(decays.begin(), decays.end(), decay_[u.index]) == decays.end())
      decays.push_back(decay_[u.index]);
  for (double decay : decays) {
    std::vector<ParamUpdate> some;
    for (const ParamUpdate& u : updates)
      if (decay_[u.index] == decay) some.push_back(u);
    AdamWOptions o = options_;
    o.weight_decay = decay;
    auto rest = detail::fused_adam(
        some, detail::fused_settings(o, lr_, /*decoupled=*/true), lr_,
        [this](size_t i) -> NamedTensors& { return state(i); },
        [](NamedTensors& st) { return increment_step(st); });
    for (ParamUpdate& r : rest) update(r.index, r.param, r.grad);
  }
}

void AdamW::update(size_t index, Tensor& param, const Tensor& grad) {
  const AdamWOptions& o = options_;
  NamedTensors& st = state(index);
  double step = increment_step(st);
  Tensor g = o.maximize ? neg(grad) : grad;
  param.mul_(1 - lr_ * decay_[index]);
  detail::adam_step(st, param, g, detail::adam_settings(o, lr_, step));
}

}  // namespace gw::optim
