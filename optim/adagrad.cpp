#include "optim/adagrad.h"

#include "core/ops.h"
#include "optim/check.h"

namespace gw::optim {

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradOptions& options)
    : Optimizer(std::move(params), "Adagrad"), options_(options) {
  detail::check_at_least("Adagrad", "lr", options.lr);
  detail::check_at_least("Adagrad", "lr_decay", options.lr_decay);
  detail::check_at_least("Adagrad", "weight_decay", options.weight_decay);
  detail::check_at_least("Adagrad", "initial_accumulator_value", options.initial_accumulator_value);
  detail::check_at_least("Adagrad", "eps", options.eps);
  lr_ = options.lr;
  for (size_t i = 0; i < parameters().size(); ++i) init_state(i, parameters()[i]);
}

void Adagrad::init_state(size_t index, const Tensor& param) {
  NamedTensors& st = state(index);
  st["step"] = scalar_tensor(0.0, kFloat32);
  st["sum"] = full_like(param, options_.initial_accumulator_value);
}

std::vector<std::string> Adagrad::state_names() const { return {"step", "sum"}; }

void Adagrad::update(size_t index, Tensor& param, const Tensor& grad) {
  const AdagradOptions& o = options_;
  NamedTensors& st = state(index);
  // Empty after load_state_dict of a dict without this parameter: start it afresh.
  if (st.empty()) init_state(index, param);
  double step = increment_step(st);
  Tensor g = o.maximize ? neg(grad) : grad;
  if (o.weight_decay != 0) g = add(g, param, o.weight_decay);
  double clr = lr_ / (1 + (step - 1) * o.lr_decay);
  Tensor& state_sum = st.at("sum");
  state_sum.add_(mul(g, g));
  Tensor denom = sqrt(state_sum).add_(o.eps);
  param.add_(div(g, denom), -clr);
}

}  // namespace gw::optim
