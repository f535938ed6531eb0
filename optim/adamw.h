// AdamW, as torch.optim.AdamW (PyTorch 1.13): Adam with decoupled weight decay. The parameter
// is shrunk by (1 - lr * weight_decay) before the Adam update instead of the decay entering
// the gradient, so it is not rescaled by the adaptive denominator (Loshchilov & Hutter).
//
//   gw::optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.05});
#pragma once

#include <array>

#include "optim/optimizer.h"

namespace gw::optim {

struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;
  double weight_decay = 1e-2;  // torch's AdamW default, unlike Adam's 0
  bool amsgrad = false;
  bool maximize = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  static AdamWOptions options(double lr) { return AdamWOptions{.lr = lr}; }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  // Parameters on a device with a fused Adam kernel (CUDA) take it, the rest update().
  void apply(std::vector<ParamUpdate>& updates) override;
  std::vector<std::string> state_names() const override;

 private:
  AdamWOptions options_;
};

}  // namespace gw::optim
