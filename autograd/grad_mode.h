// Grad mode: whether operations record history. On by default, per thread. Optimizers and
// evaluation loops turn it off with NoGradGuard, as `with torch.no_grad():` does.
#pragma once

#include "core/grad_hooks.h"

namespace gw::autograd {

inline bool is_grad_enabled() { return grad_mode_enabled(); }

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(grad_mode_enabled()) {
    set_grad_mode_enabled(enabled);
  }
  ~GradModeGuard() { set_grad_mode_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

struct NoGradGuard : GradModeGuard {
  NoGradGuard() : GradModeGuard(false) {}
};
struct EnableGradGuard : GradModeGuard {
  EnableGradGuard() : GradModeGuard(true) {}
};

}  // namespace gw::autograd
