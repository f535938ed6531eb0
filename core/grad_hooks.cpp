#include "core/grad_hooks.h"

namespace gw {

namespace detail {
constinit std::atomic<GradRecorder*> g_grad_recorder{nullptr};
thread_local constinit bool t_grad_mode __attribute__((tls_model("initial-exec"))) = true;

void check_inplace_allowed(const Tensor& self, const char* op) {
  GW_CHECK(!(t_grad_mode && self.requires_grad()), InvalidArgumentError, "[", op,
           "] cannot modify in place a tensor that requires grad while grad mode is on; "
           "use gw::autograd::NoGradGuard (as optimizers do) or an out-of-place op");
}

void mark_requires_grad(Tensor& t, const char* op) {
  GW_CHECK(t.is_floating_point(), DTypeError, "[", op,
           "] requires_grad needs a floating point tensor, got ", t.dtype());
  GW_CHECK(g_grad_recorder.load(std::memory_order_acquire) != nullptr, StateError, "[", op,
           "] requires_grad: autograd is not installed; ask for gradients with "
           "TensorOptions::with_requires_grad or Tensor::requires_grad_ (gw_autograd), which "
           "install it, not by setting the field");
  t.impl()->requires_grad = true;
}
}  // namespace detail

void install_grad_recorder(GradRecorder* recorder) {
  detail::g_grad_recorder.store(recorder, std::memory_order_release);
}
bool grad_mode_enabled() { return detail::t_grad_mode; }
void set_grad_mode_enabled(bool enabled) { detail::t_grad_mode = enabled; }

}  // namespace gw
