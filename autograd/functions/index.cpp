// Derivative rules of the indexing ops: what was picked gets its gradient back by scatter-add.
#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

class IndexSelectBackward final : public Node {
 public:
  IndexSelectBackward(const Tensor& x, int64_t dim, const Tensor& index)
      : shape_(x.sizes()), dtype_(x.dtype()), dim_(dim), index_(index) {}
  std::string name() const override { return "IndexSelectBackward"; }
  void release_variables() override { index_.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (shape_.empty()) return {g.reshape({})};
    // index_add along dim: broadcast the 1-D index over the gradient and scatter-add it.
    Shape view(g.dim(), 1);
    view[dim_] = g.size(dim_);
    Tensor idx = index_.unpack(*this).reshape(view).expand(g.sizes());
    Tensor r = zeros(shape_, TensorOptions(dtype_).with_device(g.device()));
    r.scatter_add_(dim_, idx, g);
    return {r};
  }

 private:
  Shape shape_;
  DType dtype_;
  int64_t dim_;
  SavedTensor index_;
};

class GatherBackward final : public Node {
 public:
  GatherBackward(const Tensor& x, int64_t dim, const Tensor& index)
      : shape_(x.sizes()), dtype_(x.dtype()), dim_(dim), index_(index) {}
  std::string name() const override { return "GatherBackward"; }
  void release_variables() override { index_.reset(); }
  TensorList apply(TensorList&& grads) override {
    Tensor r = zeros(shape_, TensorOptions(dtype_).with_device(grads[0].device()));
    r.scatter_add_(dim_, index_.unpack(*this), grads[0]);
    return {r};
  }

 private:
  Shape shape_;
  DType dtype_;
  int64_t dim_;
  SavedTensor index_;
};

class ScatterAddBackward final : public Node {
 public:
  ScatterAddBackward(int64_t dim, const Tensor& index, const Tensor& src)
      : dim_(dim), index_(index), src_shape_(src.sizes()), src_dtype_(src.dtype()) {}
  std::string name() const override { return "ScatterAddBackward"; }
  void release_variables() override { index_.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor gsrc;
    if (wants(*this, 1)) {
      Tensor index = index_.unpack(*this);
      gsrc = gather(g, dim_, index);
      if (gsrc.sizes() != src_shape_) {
        // index may cover only a corner of src: the rest of src was not added anywhere.
        Tensor full = zeros(src_shape_, TensorOptions(src_dtype_).with_device(g.device()));
        Tensor corner = full;
        for (int64_t d = 0; d < index.dim(); ++d) corner = corner.narrow(d, 0, index.size(d));
        corner.copy_(gsrc);
        gsrc = full;
      }
    }
    return {g, gsrc};
  }

 private:
  int64_t dim_;
  SavedTensor index_;
  Shape src_shape_;
  DType src_dtype_;
};

}  // namespace

void Recorder::index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<IndexSelectBackward>({&x}, out, x, dim, index);
}

void Recorder::gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<GatherBackward>({&x}, out, x, dim, index);
}

void Recorder::scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                           const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<ScatterAddBackward>({&x, &src}, out, dim, index, src);
}

}  // namespace gw::autograd
