#include "optim/adamw.h"

#include "core/ops.h"
#include "optim/adam_step.h"
#include "optim/check.h"

namespace gw::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), "AdamW"), options_(options) {
  detail::check_adam_options("AdamW", options);
  lr_ = options.lr;
}

std::vector<std::string> AdamW::state_names() const {
  return detail::adam_state_names(options_.amsgrad);
}

void AdamW::apply(std::vector<ParamUpdate>& updates) {
  auto rest = detail::fused_adam(
      updates, detail::fused_settings(options_, lr_, /*decoupled=*/true), lr_,
      [this](size_t i) -> NamedTensors& { return state(i); },
      [](NamedTensors& st) { return increment_step(st); });
  for (ParamUpdate& r : rest) update(r.index, r.param, r.grad);
}

void AdamW::update(size_t index, Tensor& param, const Tensor& grad) {
  const AdamWOptions& o = options_;
  NamedTensors& st = state(index);
  double step = increment_step(st);
  Tensor g = o.maximize ? neg(grad) : grad;
  param.mul_(1 - lr_ * o.weight_decay);
  detail::adam_step(st, param, g, detail::adam_settings(o, lr_, step));
}

}  // namespace gw::optim
