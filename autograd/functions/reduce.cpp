// Derivative rules of reductions and softmax.
#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

class ReduceBackward final : public Node {
 public:
  ReduceBackward(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim, const Tensor& out)
      : op_(op), x_(op == ReduceOp::Sum ? Tensor() : x), out_(op == ReduceOp::Sum ? Tensor() : out, /*is_output=*/true),
        shape_(x.sizes()), dims_(dims), keepdim_(keepdim), dtype_(x.dtype()) {}
  std::string name() const override {
    static constexpr const char* kNames[] = {"SumBackward", "ProdBackward", "MaxBackward",
                                             "MinBackward"};
    return kNames[static_cast<int>(op_)];
  }
  void release_variables() override {
    x_.reset();
    out_.reset();
  }

  TensorList apply(TensorList&& grads) override {
    Tensor g = expand_reduced(grads[0], shape_, dims_, keepdim_);
    if (op_ == ReduceOp::Sum) return {g.to(dtype_)};
    Tensor x = x_.unpack(*this);
    Tensor out = expand_reduced(out_.unpack(*this), shape_, dims_, keepdim_);
    if (op_ == ReduceOp::Prod) {
      // d(prod)/dx_i = prod / x_i; valid while no x_i is zero (documented limitation).
      return {mul(g, div(out, x)).to(dtype_)};
    }
    // max/min: the gradient is shared evenly among the elements equal to the extreme.
    Tensor hit = eq(x, out).to(dtype_);
    Tensor count = expand_reduced(sum(hit, dims_, true), shape_, dims_, true);
    return {div(mul(g, hit), count)};
  }

 private:
  ReduceOp op_;
  SavedTensor x_, out_;
  Shape shape_, dims_;
  bool keepdim_;
  DType dtype_;
};

class IndexedExtremeBackward final : public Node {
 public:
  IndexedExtremeBackward(const Tensor& x, int64_t dim, bool keepdim, const Tensor& indices)
      : indices_(indices), shape_(x.sizes()), dim_(dim), keepdim_(keepdim), dtype_(x.dtype()) {}
  std::string name() const override { return "MaxOrMinAlongDimBackward"; }
  void release_variables() override { indices_.reset(); }
  TensorList apply(TensorList&& grads) override {
    Tensor g = grads[0], idx = indices_.unpack(*this);
    if (!keepdim_ && !shape_.empty()) {
      g = g.unsqueeze(dim_);
      idx = idx.unsqueeze(dim_);
    }
    Tensor r = zeros(shape_.empty() ? Shape{1} : shape_, TensorOptions(dtype_));
    r.scatter_add_(dim_, idx, g.reshape(idx.sizes()).to(dtype_));
    return {r.reshape(shape_)};
  }

 private:
  SavedTensor indices_;
  Shape shape_;
  int64_t dim_;
  bool keepdim_;
  DType dtype_;
};

class SoftmaxBackward final : public Node {
 public:
  SoftmaxBackward(const Tensor& out, int64_t dim, bool log) : out_(out, /*is_output=*/true), dim_(dim), log_(log) {}
  std::string name() const override { return log_ ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  void release_variables() override { out_.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor y = out_.unpack(*this);
    if (y.dim() == 0) return {zeros_like(y)};
    if (log_) return {sub(g, mul(exp(y), sum(g, {dim_}, true)))};  // g - softmax * sum(g)
    return {mul(y, sub(g, sum(mul(g, y), {dim_}, true)))};      // y * (g - <g, y>)
  }

 private:
  SavedTensor out_;
  int64_t dim_;
  bool log_;
};

}  // namespace

void Recorder::reduce(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim,
                      const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<ReduceBackward>({&x}, out, op, x, dims, keepdim, out);
}

void Recorder::reduce_with_index(const Tensor& x, int64_t dim, bool keepdim, const Tensor& values,
                                 const Tensor& indices) {
  if (!values.is_floating_point()) return;
  record<IndexedExtremeBackward>({&x}, values, x, dim, keepdim, indices);
}

void Recorder::softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) {
  record<SoftmaxBackward>({&x}, out, out, dim, log);
}

}  // namespace gw::autograd
