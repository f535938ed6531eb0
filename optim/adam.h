// Adam, as torch.optim.Adam (PyTorch 1.13), with L2 weight decay added to the gradient and the
// AMSGrad variant. For decoupled weight decay use AdamW (optim/adamw.h).
//
//   gw::optim::Adam opt(params, {.lr = 1e-3, .betas = {0.9, 0.99}, .amsgrad = true});
#pragma once

#include <array>

#include "optim/optimizer.h"

namespace gw::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  static AdamOptions options(double lr) { return AdamOptions{.lr = lr}; }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  // Parameters on a device with a fused Adam kernel (CUDA) take it, the rest update().
  void apply(std::vector<ParamUpdate>& updates) override;
  std::vector<std::string> state_names() const override;

 private:
  AdamOptions options_;
};

}  // namespace gw::optim
