// Stochastic gradient descent with momentum, as torch.optim.SGD (PyTorch 1.13):
//
//   d = grad (negated when maximize) + weight_decay * param
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf          (when momentum != 0)
//   param -= lr * d
//
//   gw::optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
#pragma once

#include <limits>

#include "optim/optimizer.h"

namespace gw::optim {

struct SGDOptions {
  // Required, as in torch (no default learning rate fits every problem); NaN means "not given".
  double lr = std::numeric_limits<double>::quiet_NaN();
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  double weight_decay = 0;
  bool maximize = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  static SGDOptions options(double lr) { return SGDOptions{.lr = lr}; }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;

 private:
  SGDOptions options_;
};

}  // namespace gw::optim
