#include "core/grad_hooks.h"

namespace gw {

namespace detail {
GradRecorder* g_grad_recorder = nullptr;
thread_local constinit bool t_grad_mode __attribute__((tls_model("initial-exec"))) = true;

void check_inplace_allowed(const Tensor& self, const char* op) {
  GW_CHECK(!(t_grad_mode && self.requires_grad()), InvalidArgumentError, "[", op,
           "] cannot modify in place a tensor that requires grad while grad mode is on; "
           "use gw::autograd::NoGradGuard (as optimizers do) or an out-of-place op");
}
}  // namespace detail

void install_grad_recorder(GradRecorder* recorder) { detail::g_grad_recorder = recorder; }
bool grad_mode_enabled() { return detail::t_grad_mode; }
void set_grad_mode_enabled(bool enabled) { detail::t_grad_mode = enabled; }

}  // namespace gw
