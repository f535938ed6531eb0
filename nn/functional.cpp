#include "nn/functional.h"

#include <algorithm>

namespace gw::nn::functional {

namespace {

void check_floating(const Tensor& x, const char* op, const char* what) {
  GW_CHECK(x.is_floating_point(), DTypeError, "[", op, "] ", what, " must be floating point, got ",
           x.dtype());
}

Tensor reduce(const Tensor& losses, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return losses;
    case Reduction::kSum:
      return losses.sum();
    case Reduction::kMean:
      return losses.mean();
  }
  return losses;
}

// Shape without dim d: the target shape that goes with a classification input.
Shape without_dim(const Shape& shape, int64_t d) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i != d) out.push_back(shape[i]);
  }
  return out;
}

// -input[target] along the class dim; `op` is the user-facing name for the messages.
Tensor nll(const Tensor& input, const Tensor& target, Reduction reduction, const char* op) {
  check_floating(input, op, "input");
  GW_CHECK(target.dtype() == kInt64, DTypeError, "[", op,
           "] target must hold int64 class indices, got a ", target.dtype(), " tensor");
  GW_CHECK(input.dim() >= 1, ShapeError, "[", op,
           "] input must be (C) or (N,C,...) scores, got shape ", shape_str(input.sizes()));
  const int64_t class_dim = input.dim() == 1 ? 0 : 1;
  const int64_t classes = input.size(class_dim);
  Shape expected = without_dim(input.sizes(), class_dim);
  GW_CHECK(target.sizes() == expected, ShapeError, "[", op, "] target of shape ",
           shape_str(target.sizes()), " does not fit input of shape ", shape_str(input.sizes()),
           " (expected target shape ", shape_str(expected), ")");
  for (int64_t c : target.to_vector<int64_t>()) {
    GW_CHECK(c >= 0 && c < classes, IndexError, "[", op, "] target ", c, " is out of bounds for ",
             classes, " classes");
  }
  Tensor picked = gather(input, class_dim, target.unsqueeze(class_dim)).squeeze(class_dim);
  return reduce(neg(picked), reduction);
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  GW_CHECK(p >= 0 && p <= 1, InvalidArgumentError, "[dropout] p must be in [0, 1], got ", p);
  check_floating(x, "dropout", "input");
  if (!training || p == 0) return x;
  if (p == 1) return x * 0.0;  // keeps the graph: every gradient is zero
  // The scale is folded into the mask so the backward is a single multiply by it.
  Tensor mask = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  bernoulli_(mask, 1 - p, gen);
  mask.mul_(1 / (1 - p));
  return x * mask;
}

Tensor dropout(const Tensor& x, double p, bool training) {
  return dropout(x, p, training, default_generator());
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  GW_CHECK(weight.dim() == 2, ShapeError, "[linear] weight must be (out,in), got shape ",
           shape_str(weight.sizes()));
  GW_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError, "[linear] input of shape ",
           shape_str(x.sizes()), " does not fit weight of shape ", shape_str(weight.sizes()),
           " (the last dimension must be ", weight.size(1), ")");
  GW_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ShapeError,
           "[linear] bias of shape ", shape_str(bias.sizes()), " does not fit weight of shape ",
           shape_str(weight.sizes()), " (expected (", weight.size(0), "))");
  return gw::linear(x, weight, bias);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return gw::flatten(x, start_dim, end_dim);
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  GW_CHECK(weight.dim() == 2, ShapeError,
           "[embedding] weight must be (num_embeddings, dim), got "
           "shape ",
           shape_str(weight.sizes()));
  GW_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, DTypeError,
           "[embedding] indices must be int64 or int32, got ", indices.dtype());
  const int64_t n = weight.size(0);
  for (int64_t i : indices.to_vector<int64_t>()) {
    GW_CHECK(i >= 0 && i < n, IndexError, "[embedding] index ", i, " is out of range for ", n,
             " embeddings");
  }
  return gw::embedding(weight, indices);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  check_floating(x, "layer_norm", "input");
  const auto k = static_cast<int64_t>(normalized_shape.size());
  bool fits = k >= 1 && x.dim() >= k &&
              std::equal(normalized_shape.begin(), normalized_shape.end(), x.sizes().end() - k);
  GW_CHECK(fits, ShapeError, "[layer_norm] input of shape ", shape_str(x.sizes()),
           " does not end with normalized_shape ", shape_str(normalized_shape));
  for (const Tensor* t : {&weight, &bias}) {
    GW_CHECK(!t->defined() || t->sizes() == normalized_shape, ShapeError, "[layer_norm] ",
             t == &weight ? "weight" : "bias", " of shape ", shape_str(t->sizes()),
             " does not match normalized_shape ", shape_str(normalized_shape));
  }
  Shape dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  Tensor centered = x - x.mean(dims, true);
  Tensor var = square(centered).mean(dims, true);  // biased, as PyTorch's layer_norm
  Tensor y = centered * rsqrt(var + eps);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  GW_CHECK(weight.dim() == 4, ShapeError, "[conv2d] weight must be (O,C,kh,kw), got shape ",
           shape_str(weight.sizes()));
  GW_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError,
           "[conv2d] input must be (N,C,H,W) or (C,H,W), got shape ", shape_str(x.sizes()));
  if (x.dim() == 3) return functional::conv2d(x.unsqueeze(0), weight, bias, options).squeeze(0);
  GW_CHECK(x.size(1) == weight.size(1), ShapeError, "[conv2d] input of shape ",
           shape_str(x.sizes()), " has ", x.size(1), " channels but weight of shape ",
           shape_str(weight.sizes()), " expects ", weight.size(1));
  GW_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ShapeError,
           "[conv2d] bias of shape ", shape_str(bias.sizes()), " does not fit ", weight.size(0),
           " output channels");
  return gw::conv2d(x, weight, bias, options);
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  GW_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError,
           "[max_pool2d] input must be (N,C,H,W) or (C,H,W), got shape ", shape_str(x.sizes()));
  if (x.dim() == 3)
    return functional::max_pool2d(x.unsqueeze(0), kernel, stride, padding).squeeze(0);
  // A window made only of padding would output -inf; PyTorch forbids it the same way.
  for (int i = 0; i < 2; ++i) {
    GW_CHECK(padding[i] >= 0 && padding[i] <= kernel[i] / 2, InvalidArgumentError,
             "[max_pool2d] padding (", padding[0], ",", padding[1],
             ") must be non-negative and at most half of kernel (", kernel[0], ",", kernel[1], ")");
  }
  return gw::max_pool2d(x, kernel, stride, padding);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_floating(input, "mse_loss", "input");
  check_floating(target, "mse_loss", "target");
  GW_CHECK(input.sizes() == target.sizes(), ShapeError, "[mse_loss] input of shape ",
           shape_str(input.sizes()), " and target of shape ", shape_str(target.sizes()), " differ");
  return reduce(square(input - target), reduction);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return nll(input, target, reduction, "nll_loss");
}

Tensor cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_floating(input, "cross_entropy", "input");
  GW_CHECK(input.dim() >= 1, ShapeError,
           "[cross_entropy] input must be (C) or (N,C,...) scores, got shape ",
           shape_str(input.sizes()));
  return nll(log_softmax(input, input.dim() == 1 ? 0 : 1), target, reduction, "cross_entropy");
}

}  // namespace gw::nn::functional
