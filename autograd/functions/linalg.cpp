// Derivative rules of the matrix product and of addmm (a bias plus a product).
#include <optional>
#include <utility>

#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

// The last two dims swapped: a view, no copy.
Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

bool column_major(const Tensor& t) {
  return t.dim() >= 2 && t.stride(-2) == 1 && t.size(-2) > 1 && t.stride(-1) != 1;
}

// x @ y, computed so that the result has the memory layout of `like` (row- or column-major):
// the gradient of a transposed weight (linear layers use weight.t()) then comes out with the
// weight's own layout, and the transpose backward turns it into a contiguous .grad.
Tensor product_like(const Tensor& x, const Tensor& y, const Tensor& like) {
  if (column_major(like)) return mT(matmul(mT(y), mT(x)));
  return matmul(x, y);
}

// a @ b, or input + a @ b (addmm: then the first edge is the input's, which gets the gradient
// summed over the rows it was broadcast to).
class ProductBackward final : public Node {
 public:
  ProductBackward(const Tensor& a, const Tensor& b) : a_(a), b_(b) {}
  ProductBackward(const Tensor& input, const Tensor& a, const Tensor& b)
      : input_{{input.sizes(), input.dtype()}}, a_(a), b_(b) {}
  std::string name() const override { return input_ ? "AddmmBackward" : "MatmulBackward"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor a = a_.unpack(*this), b = b_.unpack(*this);
    const size_t first = input_ ? 1 : 0;  // a's edge
    TensorList out(first + 2);
    if (wants(*this, first)) out[first] = product_like(g, mT(b), a);  // dA = dC @ Bᵀ
    // A Linear's (b = weight.t(), the input a bias row, dC of several rows): dBᵀ = dCᵀ A and
    // the bias's gradient, the column sums of dC, from one read of dC where the backend can
    // (with sum_to's bits); one of them alone, or one row, the ops below.
    const bool bias_row = input_ && g.dim() == 2 && g.size(0) > 1 && !input_->first.empty() &&
                          input_->first.back() == g.size(1) && numel(input_->first) == g.size(1);
    if (bias_row && wants(*this, 0) && wants(*this, first + 1) && column_major(b)) {
      if (auto fused = detail::mm_and_row_sums(mT(g), a)) {
        out[first + 1] = mT(fused->first);
        out[0] = fused->second.view(input_->first).to(input_->second);
        return out;
      }
    }
    if (input_ && wants(*this, 0)) out[0] = sum_to(g, input_->first).to(input_->second);
    if (wants(*this, first + 1)) out[first + 1] = product_like(mT(a), g, b);  // dB = Aᵀ @ dC
    return out;
  }

 private:
  std::optional<std::pair<Shape, DType>> input_;
  SavedTensor a_, b_;
};

}  // namespace

void Recorder::addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) {
  record<ProductBackward>({&input, &a, &b}, out, input, a, b);
}

void Recorder::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!out.is_floating_point()) return;
  record<ProductBackward>({&a, &b}, out, a, b);
}

}  // namespace gw::autograd
