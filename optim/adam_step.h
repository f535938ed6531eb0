// The moment updates Adam and AdamW share (internal; not installed). They differ only in how
// weight decay enters: Adam adds it to the gradient, AdamW shrinks the parameter directly.
#pragma once

#include <string>
#include <vector>

#include "core/serialize.h"
#include "core/tensor.h"

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

}  // namespace gw::optim::detail
