#include "optim/rmsprop.h"

#include "core/ops.h"
#include "optim/check.h"

namespace gw::optim {

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropOptions& options)
    : Optimizer(std::move(params), "RMSprop"), options_(options) {
  detail::check_at_least("RMSprop", "lr", options.lr);
  detail::check_at_least("RMSprop", "eps", options.eps);
  detail::check_at_least("RMSprop", "momentum", options.momentum);
  detail::check_at_least("RMSprop", "weight_decay", options.weight_decay);
  detail::check_at_least("RMSprop", "alpha", options.alpha);
  lr_ = options.lr;
}

std::vector<std::string> RMSprop::state_names() const {
  std::vector<std::string> names = {"step", "square_avg"};
  if (options_.momentum > 0) names.push_back("momentum_buffer");
  if (options_.centered) names.push_back("grad_avg");
  return names;
}

void RMSprop::update(size_t index, Tensor& param, const Tensor& grad) {
  const RMSpropOptions& o = options_;
  NamedTensors& st = state(index);
  if (st.empty()) {
    for (const std::string& name : state_names()) {
      if (name != "step") st[name] = zeros_like(param);
    }
  }
  increment_step(st);  // kept for torch's state layout; the update does not use it
  Tensor g = o.maximize ? neg(grad) : grad;
  if (o.weight_decay != 0) g = add(g, param, o.weight_decay);

  Tensor& square_avg = st.at("square_avg");
  square_avg.mul_(o.alpha).add_(mul(g, g), 1 - o.alpha);
  Tensor avg;
  if (o.centered) {
    Tensor& grad_avg = st.at("grad_avg");
    grad_avg.mul_(o.alpha).add_(g, 1 - o.alpha);
    avg = sub(square_avg, mul(grad_avg, grad_avg)).sqrt();
  } else {
    avg = sqrt(square_avg);
  }
  avg.add_(o.eps);
  if (o.momentum > 0) {
    Tensor& buf = st.at("momentum_buffer");
    buf.mul_(o.momentum).add_(div(g, avg));
    param.add_(buf, -lr_);
  } else {
    param.add_(div(g, avg), -lr_);
  }
}

}  // namespace gw::optim
