// AdamW, as torch.optim.AdamW (PyTorch 1.13): Adam with decoupled weight decay. The parameter
// is shrunk by (1 - lr * weight_decay) before the Adam update instead of the decay entering
// the gradient, so it is not rescaled by the adaptive denominator (Loshchilov & Hutter).
//
//   gw::optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.05});
//
// Parameter groups, as torch's param_groups, set the weight decay per group; the usual recipe
// for transformers decays the matrices and not the biases and norms:
//
//   gw::optim::AdamW opt(gw::optim::weight_decay_groups(model->parameters(), 0.1), {.lr = 3e-4});
#pragma once

#include <array>
#include <optional>
#include <vector>

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

// Parameters that share options, which they override where set (torch's param_groups).
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> weight_decay;  // the optimizer's when unset
};

// Two groups of `params`: those with two dims or more (the matrices of linear layers,
// embeddings) decay by weight_decay, the rest (biases, norms' scales and shifts) do not.
std::vector<ParamGroup> weight_decay_groups(const std::vector<Tensor>& params, double weight_decay);

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  // Parameters in the groups' order (parameters() and the state_dict's indices follow it, so a
  // checkpoint loads into an optimizer grouped the same way); each group's weight decay, or
  // options.weight_decay. The weight decays are not in the state_dict.
  AdamW(const std::vector<ParamGroup>& groups, const AdamWOptions& options = {});
  static AdamWOptions options(double lr) { return AdamWOptions{.lr = lr}; }
  // The weight decay of parameters()[index].
  double weight_decay(size_t index) const { return decay_.at(index); }

 protected:
  void update(size_t index, Tensor& param, const Tensor& grad) override;
  // Parameters on a device with a fused Adam kernel (CUDA) take it, the rest update().
  void apply(std::vector<ParamUpdate>& updates) override;
  std::vector<std::string> state_names() const override;

 private:
  AdamWOptions options_;
  std::vector<double> decay_;  // per parameter
};

}  // namespace gw::optim
