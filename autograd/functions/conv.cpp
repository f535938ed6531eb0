// Derivative rule of im2col: its adjoint, col2im, sums each column entry back into the input.
#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"
#include "core/backend.h"

namespace gw::autograd {

namespace {

class Unfold2dBackward final : public Node {
 public:
  Unfold2dBackward(const Tensor& x, const std::array<int64_t, 8>& params)
      : shape_(x.sizes()), params_(params) {}
  std::string name() const override { return "Unfold2dBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor r = empty(shape_, g.options());
    backend_for(g, "unfold backward").fold2d(g, params_, r);
    return {r};
  }

 private:
  Shape shape_;
  std::array<int64_t, 8> params_;
};

}  // namespace

void Recorder::unfold2d(const Tensor& x, const std::array<int64_t, 8>& params, const Tensor& out) {
  record<Unfold2dBackward>({&x}, out, x, params);
}

}  // namespace gw::autograd
