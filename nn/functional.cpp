#include "nn/functional.h"

#include <algorithm>

#include "autograd/functions/common.h"
#include "core/autocast.h"
#include "core/backend.h"
#include "core/grad_hooks.h"

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

// Checks a classification target against its input; `op` names the user-facing op.
void check_target(const Tensor& input, const Tensor& target, const char* op) {
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
}

// -input[target] along the class dim.
Tensor nll(const Tensor& input, const Tensor& target, Reduction reduction, const char* op) {
  if (autocast_widens({&input})) return nll(autocast_widen(input), target, reduction, op);
  check_target(input, target, op);
  const int64_t class_dim = input.dim() == 1 ? 0 : 1;
  Tensor picked = gather(input, class_dim, target.unsqueeze(class_dim)).squeeze(class_dim);
  return reduce(neg(picked), reduction);
}

// cross_entropy's derivative for (N, C) scores: one fused kernel, softmax minus the one-hot
// target, scaled by each row's incoming gradient.
class CrossEntropyBackward final : public autograd::Node {
 public:
  CrossEntropyBackward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                       Shape input_shape)
      : logits_(logits), target_(target), lse_(lse), shape_(std::move(input_shape)) {}
  std::string name() const override { return "CrossEntropyBackward"; }
  void release_variables() override {
    logits_.reset();
    target_.reset();
    lse_.reset();
  }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    Tensor logits = logits_.unpack(*this);
    Tensor grad = empty_like(logits);
    backend_for(logits, "cross_entropy_backward")
        .cross_entropy_backward(logits, target_.unpack(*this), lse_.unpack(*this),
                                grads[0].to(logits.dtype()).contiguous(), grad);
    return {grad.reshape(shape_)};
  }

 private:
  autograd::SavedTensor logits_, target_, lse_;
  Shape shape_;
};

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

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
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
  const Tensor out = gw::embedding(weight, indices);
  if (!padding_idx) return out;
  const int64_t pad = *padding_idx;
  GW_CHECK(pad >= -n && pad < n, IndexError, "[embedding] padding_idx ", pad,
           " is out of range for ", n, " embeddings");
  // The padded places read the row cut off from the graph: its value, and no gradient.
  const Tensor padded = eq(indices, pad < 0 ? pad + n : pad).unsqueeze(-1);
  return where(padded, out.detach(), out);
}

namespace {

// layer_norm's derivative, one fused kernel for all three gradients (Backend).
class LayerNormBackward final : public autograd::Node {
 public:
  LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    Shape normalized_shape)
      : x_(x), weight_(weight), mean_(mean), rstd_(rstd), shape_(std::move(normalized_shape)) {}
  std::string name() const override { return "LayerNormBackward"; }
  void release_variables() override {
    x_.reset();
    weight_.reset();
    mean_.reset();
    rstd_.reset();
  }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    Tensor x = x_.unpack(*this), w = weight_.defined() ? weight_.unpack(*this) : Tensor();
    Tensor gx, gw, gb;
    if (autograd::wants(*this, 0)) gx = empty_like(x);
    if (autograd::wants(*this, 1)) gw = zeros(shape_, x.options());  // zeros: sums of no rows
    if (autograd::wants(*this, 2)) gb = zeros(shape_, x.options());
    if (x.numel() == 0) return {gx, gw, gb};
    backend_for(x, "layer_norm_backward")
        .layer_norm_backward(grads[0].to(x.dtype()).contiguous(), x, w, mean_.unpack(*this),
                             rstd_.unpack(*this), gx, gw, gb);
    return {gx, gw, gb};
  }

 private:
  autograd::SavedTensor x_, weight_, mean_, rstd_;
  Shape shape_;
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (autocast_widens({&x, &weight, &bias})) {
    return layer_norm(autocast_widen(x), normalized_shape, autocast_widen(weight),
                      autocast_widen(bias), eps);
  }
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
  check_same_device("layer_norm", {&x, &weight, &bias});
  const int64_t n = numel(normalized_shape), rows = n == 0 ? 0 : x.numel() / n;
  const DType stat = x.element_size() == 2 ? kFloat32 : x.dtype();
  // The output has the input's dtype; weight and bias of another one (float32 weights beside
  // bfloat16 activations) are converted, and their gradients converted back by autograd.
  auto as_input = [&x](const Tensor& t) {
    return t.defined() ? t.to(x.dtype()).contiguous() : Tensor();
  };
  const Tensor xc = x.contiguous(), w = as_input(weight), b = as_input(bias);
  Tensor y = empty(x.sizes(), x.options().with_requires_grad(false));
  Tensor mean = empty({rows}, x.options().with_dtype(stat).with_requires_grad(false));
  Tensor rstd = empty_like(mean);
  if (rows > 0 && n > 0) backend_for(x, "layer_norm").layer_norm(xc, w, b, eps, y, mean, rstd);
  if (detail::recorder_for({&x, &w, &b})) {
    autograd::record<LayerNormBackward>({&x, &w, &b}, y, xc, w, mean, rstd, normalized_shape);
  }
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
  if (autocast_widens({&input, &target})) {
    return mse_loss(autocast_widen(input), autocast_widen(target), reduction);
  }
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
  if (autocast_widens({&input})) return cross_entropy(autocast_widen(input), target, reduction);
  check_floating(input, "cross_entropy", "input");
  GW_CHECK(input.dim() >= 1, ShapeError,
           "[cross_entropy] input must be (C) or (N,C,...) scores, got shape ",
           shape_str(input.sizes()));
  if (input.dim() > 2) {  // (N, C, d1, ...): the class dim is not the rows' last
    return nll(log_softmax(input, 1), target, reduction, "cross_entropy");
  }
  check_target(input, target, "cross_entropy");
  check_same_device("cross_entropy", {&input, &target});
  // (C) is one row; the per-row losses come back in the target's shape.
  const Tensor logits = input.dim() == 1 ? input.unsqueeze(0).contiguous() : input.contiguous();
  const Tensor labels = target.reshape({logits.size(0)}).contiguous();
  const DType stat = input.element_size() == 2 ? kFloat32 : input.dtype();
  Tensor losses = empty({logits.size(0)}, input.options().with_requires_grad(false));
  Tensor lse = empty({logits.size(0)}, input.options().with_dtype(stat).with_requires_grad(false));
  backend_for(input, "cross_entropy").cross_entropy(logits, labels, losses, lse);
  if (detail::recorder_for(input)) {
    autograd::record<CrossEntropyBackward>({&input}, losses, logits, labels, lse, input.sizes());
  }
  return reduce(losses.reshape(target.sizes()), reduction);
}

}  // namespace gw::nn::functional
