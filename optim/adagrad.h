// Adagrad, as torch.optim.Adagrad (PyTorch 1.13): each element's step is scaled by the root of
// its accumulated squared gradients, and the learning rate decays as lr / (1 + (t-1) lr_decay).
//
//   gw::optim::Adagrad opt(params, {.lr = 0.1, .initial_accumulator_value = 0.1});
#pragma once

#include "optim/optimizer.h"

namespace gw::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;
};

class Adagrad : public Optimizer {
 public:
  // The accumulators are created here (as torch does), so state_dict() has them at once.
  Adagrad(std::vector<Tensor> params, const AdagradOptions& options = {});
  static AdagradOptions options(double lr) { return AdagradOptions{.lr = lr}; }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;

 private:
  void init_state(size_t index, const Tensor& param);

  AdagradOptions options_;
};

}  // namespace gw::optim
