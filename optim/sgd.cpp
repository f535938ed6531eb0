#include "optim/sgd.h"

#include <cmath>

#include "core/ops.h"
#include "optim/check.h"

namespace gw::optim {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), "SGD"), options_(options) {
  GW_CHECK(!std::isnan(options.lr), InvalidArgumentError,
           "[SGD] lr is required: SGDOptions{.lr = ...}");
  detail::check_at_least("SGD", "lr", options.lr);
  detail::check_at_least("SGD", "momentum", options.momentum);
  detail::check_at_least("SGD", "weight_decay", options.weight_decay);
  GW_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
           InvalidArgumentError,
           "[SGD] nesterov momentum requires a momentum and zero dampening, got momentum ",
           options.momentum, " and dampening ", options.dampening);
  lr_ = options.lr;
}

std::vector<std::string> SGD::state_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(size_t index, Tensor& param, const Tensor& grad) {
  const SGDOptions& o = options_;
  Tensor d_p = o.maximize ? neg(grad) : grad;
  if (o.weight_decay != 0) d_p = add(d_p, param, o.weight_decay);
  if (o.momentum != 0) {
    NamedTensors& st = state(index);
    auto it = st.find("momentum_buffer");
    if (it == st.end()) {
      // The first buffer is the gradient itself (no dampening), as in torch.
      it = st.emplace("momentum_buffer", d_p.clone()).first;
    } else {
      it->second.mul_(o.momentum).add_(d_p, 1 - o.dampening);
    }
    d_p = o.nesterov ? add(d_p, it->second, o.momentum) : it->second;
  }
  param.add_(d_p, -lr_);
}

}  // namespace gw::optim
