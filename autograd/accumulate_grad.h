// The sink of a leaf's gradient: runs the leaf's hooks, accumulates into `.grad` (or hands the
// gradient to the task's leaf_sink), then runs post-accumulate hooks (DDP's readiness signal).
#pragma once

#include "autograd/node.h"

namespace gw::autograd {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable) : Node(First{}), variable(std::move(variable)) {}
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  // The hooks registered on the leaf (Tensor::register_hook), in order, over `grad`.
  Tensor run_leaf_hooks(Tensor grad) const;

  Tensor variable;
};

// Adds `grad` to the leaf's .grad (steals it when nothing else refers to it).
void accumulate_into_grad(const Tensor& leaf, const Tensor& grad);

// Whether `t` alone reaches its memory: no other handle on it or on its storage (views
// included). Such a gradient may become .grad without a copy, or be added to in place, unseen.
inline bool sole_owner(const Tensor& t) {
  return t.use_count() == 1 && t.storage().use_count() == 1;
}

}  // namespace gw::autograd
