// Derivative rules of the matrix product and of addmm (a bias plus a product).
#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

// The last two dims swapped: a view, no copy.
Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

// x @ y, computed so that the result has the memory layout of `like` (row- or column-major):
// the gradient of a transposed weight (linear layers use weight.t()) then comes out with the
// weight's own layout, and the transpose backward turns it into a contiguous .grad.
Tensor product_like(const Tensor& x, const Tensor& y, const Tensor& like) {
  const bool column_major = like.dim() >= 2 && like.stride(-2) == 1 && like.size(-2) > 1 &&
                            like.stride(-1) != 1;
  if (column_major) return mT(matmul(mT(y), mT(x)));
  return matmul(x, y);
}

class MatmulBackward final : public Node {
 public:
  MatmulBackward(const Tensor& a, const Tensor& b) : a_(a), b_(b) {}
  std::string name() const override { return "MatmulBackward"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor a = a_.unpack(*this), b = b_.unpack(*this);
    Tensor ga, gb;
    if (wants(*this, 0)) ga = product_like(g, mT(b), a);  // dA = dC @ Bᵀ
    if (wants(*this, 1)) gb = product_like(mT(a), g, b);  // dB = Aᵀ @ dC
    return {ga, gb};
  }

 private:
  SavedTensor a_, b_;
};

// input + a @ b: the product's gradients, and the input's summed over the rows it was
// broadcast to.
class AddmmBackward final : public Node {
 public:
  AddmmBackward(const Tensor& input, const Tensor& a, const Tensor& b)
      : input_shape_(input.sizes()), input_dtype_(input.dtype()), a_(a), b_(b) {}
  std::string name() const override { return "AddmmBackward"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor a = a_.unpack(*this), b = b_.unpack(*this);
    Tensor gi, ga, gb;
    if (wants(*this, 0)) gi = sum_to(g, input_shape_).to(input_dtype_);
    if (wants(*this, 1)) ga = product_like(g, mT(b), a);
    if (wants(*this, 2)) gb = product_like(mT(a), g, b);
    return {gi, ga, gb};
  }

 private:
  Shape input_shape_;
  DType input_dtype_;
  SavedTensor a_, b_;
};

}  // namespace

void Recorder::addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) {
  record<AddmmBackward>({&input, &a, &b}, out, input, a, b);
}

void Recorder::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<MatmulBackward>({&a, &b}, out, a, b);
}

}  // namespace gw::autograd
