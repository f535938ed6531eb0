// RMSprop, as torch.optim.RMSprop (PyTorch 1.13): the gradient is divided by the root of a
// running average of its square (centered: of its variance), optionally through a momentum
// buffer.
//
//   gw::optim::RMSprop opt(params, {.lr = 1e-2, .momentum = 0.9, .centered = true});
#pragma once

#include "optim/optimizer.h"

namespace gw::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;  // smoothing constant of the running averages
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;  // normalize by the estimated variance instead of the raw 2nd moment
  bool maximize = false;
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, const RMSpropOptions& options = {});
  static RMSpropOptions options(double lr) { return RMSpropOptions{.lr = lr}; }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;

 private:
  RMSpropOptions options_;
};

}  // namespace gw::optim
