// Tensor's in-place fills and copies, and the method forms of common ops (thin forwards to the
// free functions in core/ops).
#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops.h"

namespace gw {

Tensor& Tensor::zero_() { return fill_(0); }

Tensor& Tensor::fill_(const Scalar& value) {
  detail::check_inplace_allowed(*this, "fill_");
  backend_for(*this, "fill_").fill(*this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_inplace_allowed(*this, "copy_");
  check_writable("copy_", *this);
  GW_CHECK(!detail::recorder_for(src), InvalidArgumentError,
           "[copy_] copying a tensor that requires grad in place does not record gradients; "
           "use clone() or an out-of-place op, or copy under NoGradGuard");
  Tensor s = src;
  if (s.sizes() != sizes()) {
    Shape shape = broadcast_shapes(sizes(), s.sizes(), "copy_");
    GW_CHECK(shape == sizes(), ShapeError, "[copy_] source of shape ", shape_str(src.sizes()),
             " does not broadcast to ", shape_str(sizes()));
    s = s.expand(sizes());
  }
  // A source overlapping the destination (x.copy_(x.t())) must be read before it is written.
  if (s.storage() == storage() && !(s.strides() == strides() && s.storage_offset() == storage_offset())) {
    s = s.clone();
  }
  Device accel = device().is_cpu() ? s.device() : device();
  backend_for(accel.type, "copy_").copy(s, *this);
  bump_version();
  return *this;
}

Tensor Tensor::sum() const { return gw::sum(*this); }
Tensor Tensor::sum(Shape dims, bool keepdim) const { return gw::sum(*this, std::move(dims), keepdim); }
Tensor Tensor::mean() const { return gw::mean(*this); }
Tensor Tensor::mean(Shape dims, bool keepdim) const {
  return gw::mean(*this, std::move(dims), keepdim);
}
Tensor Tensor::max() const { return gw::max(*this); }
Tensor Tensor::min() const { return gw::min(*this); }
Tensor Tensor::argmax() const { return gw::argmax(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return gw::argmax(*this, dim, keepdim); }
Tensor Tensor::abs() const { return gw::abs(*this); }
Tensor Tensor::exp() const { return gw::exp(*this); }
Tensor Tensor::log() const { return gw::log(*this); }
Tensor Tensor::sqrt() const { return gw::sqrt(*this); }
Tensor Tensor::pow(const Scalar& exponent) const { return gw::pow(*this, exponent); }
Tensor Tensor::relu() const { return gw::relu(*this); }
Tensor Tensor::sigmoid() const { return gw::sigmoid(*this); }
Tensor Tensor::tanh() const { return gw::tanh(*this); }
Tensor Tensor::softmax(int64_t dim) const { return gw::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return gw::log_softmax(*this, dim); }
Tensor Tensor::matmul(const Tensor& other) const { return gw::matmul(*this, other); }
Tensor Tensor::eq(const Tensor& other) const { return gw::eq(*this, other); }

}  // namespace gw
