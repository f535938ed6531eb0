// Derivative rules of views, conversions and cat: they move gradients around without
// arithmetic (expand sums over the broadcast dims).
#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

class ReshapeBackward final : public Node {
 public:
  explicit ReshapeBackward(const Tensor& x) : shape_(x.sizes()) {}
  std::string name() const override { return "ReshapeBackward"; }
  TensorList apply(TensorList&& grads) override { return {grads[0].reshape(shape_)}; }

 private:
  Shape shape_;
};

class PermuteBackward final : public Node {
 public:
  explicit PermuteBackward(const Shape& dims) : inverse_(dims.size()) {
    for (size_t i = 0; i < dims.size(); ++i) inverse_[dims[i]] = static_cast<int64_t>(i);
  }
  std::string name() const override { return "PermuteBackward"; }
  TensorList apply(TensorList&& grads) override { return {grads[0].permute(inverse_)}; }

 private:
  Shape inverse_;
};

class ExpandBackward final : public Node {
 public:
  explicit ExpandBackward(const Tensor& x) : shape_(x.sizes()) {}
  std::string name() const override { return "ExpandBackward"; }
  TensorList apply(TensorList&& grads) override { return {sum_to(grads[0], shape_)}; }

 private:
  Shape shape_;
};

class SubViewBackward final : public Node {
 public:
  SubViewBackward(const Tensor& x, std::function<Tensor(const Tensor&)> replay)
      : shape_(x.sizes()), dtype_(x.dtype()), replay_(std::move(replay)) {}
  std::string name() const override { return "SubViewBackward"; }
  TensorList apply(TensorList&& grads) override {
    // The gradient lands in the part of the input the view selected; the rest is zero.
    Tensor r = zeros(shape_, TensorOptions(dtype_).with_device(grads[0].device()));
    replay_(r).copy_(grads[0]);
    return {r};
  }

 private:
  Shape shape_;
  DType dtype_;
  std::function<Tensor(const Tensor&)> replay_;
};

class ConvertBackward final : public Node {
 public:
  explicit ConvertBackward(const Tensor& x) : dtype_(x.dtype()), device_(x.device()) {}
  std::string name() const override { return "ToCopyBackward"; }
  TensorList apply(TensorList&& grads) override { return {grads[0].to(dtype_).to(device_)}; }

 private:
  DType dtype_;
  Device device_;
};

class CatBackward final : public Node {
 public:
  CatBackward(const std::vector<Tensor>& inputs, int64_t dim) : dim_(dim) {
    for (const Tensor& t : inputs) {
      skipped_.push_back(t.dim() == 1 && t.numel() == 0);  // cat skips 1-D empty inputs
      sizes_.push_back(skipped_.back() ? 0 : t.size(dim));
      dtypes_.push_back(t.dtype());
      shapes_.push_back(t.sizes());
    }
  }
  std::string name() const override { return "CatBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList out;
    int64_t offset = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (!wants(*this, i) || skipped_[i]) {
        out.emplace_back(skipped_[i] && wants(*this, i) ? zeros(shapes_[i], dtypes_[i]) : Tensor());
      } else {
        out.push_back(grads[0].narrow(dim_, offset, sizes_[i]).to(dtypes_[i]));
      }
      offset += sizes_[i];
    }
    return out;
  }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
  std::vector<bool> skipped_;
  std::vector<DType> dtypes_;
  std::vector<Shape> shapes_;
};

}  // namespace

void Recorder::reshape(const Tensor& x, const Tensor& out) {
  record<ReshapeBackward>({&x}, out, x);
}

void Recorder::permute(const Tensor& x, const Shape& dims, const Tensor& out) {
  record<PermuteBackward>({&x}, out, dims);
}

void Recorder::expand(const Tensor& x, const Tensor& out) { record<ExpandBackward>({&x}, out, x); }

void Recorder::sub_view(const Tensor& x, const Tensor& out,
                        std::function<Tensor(const Tensor&)> replay) {
  record<SubViewBackward>({&x}, out, x, std::move(replay));
}

void Recorder::convert(const Tensor& x, const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<ConvertBackward>({&x}, out, x);
}

void Recorder::cat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) {
  if (!out.is_floating_point()) return;
  auto node = std::make_shared<CatBackward>(inputs, dim);
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  set_history(out, node);
}

}  // namespace gw::autograd
