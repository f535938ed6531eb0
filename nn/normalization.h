// LayerNorm: normalizes over the trailing normalized_shape dims of each sample, then applies a
// learned elementwise scale (ones) and shift (zeros), as torch.nn.LayerNorm.
//
//   gw::nn::LayerNorm norm(64);  // x (B, T, 64): each 64-vector gets mean 0, variance 1
//   gw::nn::LayerNorm plain({2, 3}, 1e-6, /*elementwise_affine=*/false);
#pragma once

#include "nn/module.h"

namespace gw::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  // LayerNorm(8) is LayerNorm({8}). Only one argument: LayerNorm({4, 5}) must stay a shape, not
  // (size 4, eps 5).
  explicit LayerNorm(int64_t normalized_size);

  // Any input whose shape ends with normalized_shape.
  Tensor forward(const Tensor& input) override;
  // PyTorch's init: weight ones, bias zeros.
  void reset_parameters();

  const Shape normalized_shape;
  const double eps;
  const bool elementwise_affine;
  Tensor weight;  // normalized_shape, undefined without elementwise_affine
  Tensor bias;

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
