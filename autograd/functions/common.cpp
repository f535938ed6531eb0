#include "autograd/functions/common.h"

namespace gw::autograd {

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  }
  Tensor r = dims.empty() ? grad : sum(grad, dims, true);
  return r.reshape(shape);
}

Tensor reduce_grad(const Tensor& grad, const Tensor& input) {
  return sum_to(grad, input.sizes()).to(input.dtype());
}

Tensor expand_reduced(const Tensor& grad, const Shape& input_shape, const Shape& dims,
                      bool keepdim) {
  Tensor g = grad;
  if (!keepdim) {
    for (int64_t d : dims) g = g.unsqueeze(d);  // dims are sorted ascending
  }
  return g.expand(input_shape);
}

}  // namespace gw::autograd
