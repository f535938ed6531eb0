// Helpers shared by the derivative rules in autograd/functions/*.cpp.
#pragma once

#include <memory>

#include "autograd/node.h"
#include "core/ops.h"

namespace gw::autograd {

// Sums `grad` over the dims that broadcasting added or stretched, back to `shape`.
Tensor sum_to(const Tensor& grad, const Shape& shape);
// sum_to the input's shape and cast to its dtype: the gradient that input expects.
Tensor reduce_grad(const Tensor& grad, const Tensor& input);
// A reduction's gradient (shape of `out`) brought back to the input's shape by re-inserting
// the reduced dims (when !keepdim) and broadcasting.
Tensor expand_reduced(const Tensor& grad, const Shape& input_shape, const Shape& dims,
                      bool keepdim);

// Makes a node of type N (constructed from args), wires its edges to `inputs` and sets it as
// the history of `out`.
template <typename N, typename... Args>
std::shared_ptr<N> record(std::initializer_list<const Tensor*> inputs, const Tensor& out,
                          Args&&... args) {
  auto node = std::make_shared<N>(std::forward<Args>(args)...);
  node->next_edges = collect_edges(inputs);
  set_history(out, node);
  return node;
}

}  // namespace gw::autograd
