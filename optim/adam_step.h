// The moment updates Adam and AdamW share (internal; not installed). They differ only in how
// weight decay enters: Adam adds it to the gradient, AdamW shrinks the parameter directly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/serialize.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace gw::optim::detail {

struct AdamStep {
  double lr;
  double beta1;
  double beta2;
  double eps;
  bool amsgrad;
  double step;  // the count after this step (1 on the first)
};

// Updates exp_avg, exp_avg_sq (and max_exp_avg_sq) in `state`, creating them at zero, then
// param -= lr / (1 - beta1^step) * exp_avg / (sqrt(v) / sqrt(1 - beta2^step) + eps).
void adam_step(NamedTensors& state, Tensor& param, const Tensor& grad, const AdamStep& h);

std::vector<std::string> adam_state_names(bool amsgrad);

// The step settings from Adam's or AdamW's options (the two structs share these fields).
template <typename Options>
AdamStep adam_settings(const Options& o, double lr, double step) {
  return {.lr = lr,
          .beta1 = o.betas[0],
          .beta2 = o.betas[1],
          .eps = o.eps,
          .amsgrad = o.amsgrad,
          .step = step};
}

// The fused kernel's settings from Adam's options (decay enters the gradient) or AdamW's
// (`decoupled`: decay scales the parameter).
template <typename Options>
AdamUpdate fused_settings(const Options& o, double lr, bool decoupled) {
  return {.beta1 = o.betas[0],
          .beta2 = o.betas[1],
          .eps = o.eps,
          .weight_decay = decoupled ? 0 : o.weight_decay,
          .param_scale = decoupled ? 1 - lr * o.weight_decay : 1,
          .amsgrad = o.amsgrad,
          .maximize = o.maximize};
}

// The fused path of Adam and AdamW (Optimizer::apply): updates whose parameters are on a
// device with a fused Adam kernel run there, a launch per device, dtype and 32 parameters,
// with their state created and their step counted as update() would (state_of and
// count_step are the optimizer's). Returns the updates left for update().
std::vector<ParamUpdate> fused_adam(std::vector<ParamUpdate>& updates, const AdamUpdate& u,
                                    double lr, const std::function<NamedTensors&(size_t)>& state_of,
                                    const std::function<double(NamedTensors&)>& count_step);

}  // namespace gw::optim::detail
