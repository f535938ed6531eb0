#include "nn/normalization.h"

#include <algorithm>

#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

LayerNorm::LayerNorm(int64_t normalized_size) : LayerNorm(Shape{normalized_size}) {}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"),
      normalized_shape(std::move(normalized_shape)),
      eps(eps),
      elementwise_affine(elementwise_affine) {
  const Shape& shape = this->normalized_shape;
  GW_CHECK(
      !shape.empty() && std::all_of(shape.begin(), shape.end(), [](int64_t s) { return s > 0; }),
      InvalidArgumentError,
      "[LayerNorm] normalized_shape must be non-empty with positive sizes, got ", shape_str(shape));
  GW_CHECK(eps >= 0, InvalidArgumentError, "[LayerNorm] eps must be non-negative, got ", eps);
  if (elementwise_affine) {
    weight = register_parameter("weight", empty(shape));
    bias = register_parameter("bias", empty(shape));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!elementwise_affine) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& input) {
  const auto k = static_cast<int64_t>(normalized_shape.size());
  bool fits = input.dim() >= k &&
              std::equal(normalized_shape.begin(), normalized_shape.end(), input.sizes().end() - k);
  GW_CHECK(fits, ShapeError, "[LayerNorm] expected an input ending with normalized_shape ",
           shape_str(normalized_shape), ", got shape ", shape_str(input.sizes()));
  return functional::layer_norm(input, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  // normalized_shape prints as a Python tuple: (8,) or (2, 3).
  std::string shape = "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i) {
    shape += (i ? ", " : "") + std::to_string(normalized_shape[i]);
  }
  shape += normalized_shape.size() == 1 ? ",)" : ")";
  return shape + ", eps=" + float_repr(eps) +
         ", elementwise_affine=" + (elementwise_affine ? "True" : "False");
}

}  // namespace gw::nn
