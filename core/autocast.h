// Mixed precision as torch.autocast. Inside an AutocastGuard for a device type, ops on that
// device's tensors pick their own precision:
// - the matrix products (mm, bmm, matmul, addmm, linear), conv2d and scaled_dot_product_attention
//   run in the guard's 16-bit dtype: their float32 operands are converted first;
// - the ops that need float32's range or accuracy (softmax, log_softmax, logsumexp, sum, prod and
//   what is built on them: mean, var, std; layer_norm, the losses, exp, log, log1p, expm1, rsqrt,
//   reciprocal, pow) run in float32: their 16-bit operands are converted first;
// - every other op runs in the dtype its operands have (a 16-bit product plus a float32 residual
//   is float32, by promotion).
// Parameters stay float32: they are the master weights the optimizer steps. The conversions are
// recorded, so each gradient reaches its parameter in float32, and the products' backward runs
// in 16 bits as their forward did. float64 tensors are left alone, as in PyTorch; a float16
// operand of a product under bfloat16 autocast becomes bfloat16. One set of lists serves both
// device types (torch's CPU lists differ a little), and casts are not cached: a weight used
// twice is converted twice.
//
//   gw::optim::AdamW opt(model->parameters(), {.lr = 3e-4});       // float32 parameters
//   Tensor loss;
//   {
//     gw::AutocastGuard amp(gw::DeviceType::CUDA, gw::kBFloat16);  // torch.autocast("cuda", ...)
//     loss = model->loss(x, y);   // bfloat16 GEMMs and attention, float32 norms and loss
//   }
//   loss.backward();              // each op's backward in the dtypes its forward recorded
//   opt.step();
//
// The state is per thread, guards nest (enabled = false turns autocast off inside, as
// torch.autocast(enabled=False)), and autograd's backward runs with autocast off (what it
// recomputes for activation checkpointing runs under the state its forward had). bfloat16 has
// float32's range and needs no loss scaling; float16 needs gw::optim::GradScaler
// (optim/grad_scaler.h). On the CPU the 16-bit ops compute through float32 copies
// (core/cpu/half_as_float.h): CPU autocast checks a mixed-precision program, it does not speed
// one up.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace gw {

// What autocast does on each device type: the 16-bit dtype, or nothing.
static_assert(kNumDeviceTypes == 2, "AutocastState lists the device types");
struct AutocastState {
  bool enabled[kNumDeviceTypes] = {};
  DType dtype[kNumDeviceTypes] = {kBFloat16, kBFloat16};
  bool any() const { return enabled[0] || enabled[1]; }
};

namespace detail {
extern thread_local constinit AutocastState t_autocast __attribute__((tls_model("initial-exec")));
}

// torch.autocast(device_type, dtype, enabled) as a scope. dtype is bfloat16 or float16.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device, DType dtype = kBFloat16, bool enabled = true);
  // Sets the whole state (autograd restores a forward's state for a recomputation).
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard() { detail::t_autocast = saved_; }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState saved_;
};

inline const AutocastState& autocast_state() { return detail::t_autocast; }
inline bool is_autocast_enabled(DeviceType device) {
  return detail::t_autocast.enabled[static_cast<int>(device)];
}
inline DType autocast_dtype(DeviceType device) {
  return detail::t_autocast.dtype[static_cast<int>(device)];
}

// For the ops above. An op whose operands autocast would convert calls itself again with them
// converted (recorded casts), once:
//   if (autocast_lowers({&a, &b})) return mm(autocast_lower(a), autocast_lower(b));
namespace detail {
bool autocast_converts(std::initializer_list<const Tensor*> ts, bool lower);
}
// Whether autocast converts any float32 operand of a 16-bit op.
inline bool autocast_lowers(std::initializer_list<const Tensor*> ts) {
  return detail::t_autocast.any() && detail::autocast_converts(ts, true);
}
// Whether autocast converts any 16-bit operand of a float32 op.
inline bool autocast_widens(std::initializer_list<const Tensor*> ts) {
  return detail::t_autocast.any() && detail::autocast_converts(ts, false);
}
// The operand as a 16-bit op under autocast takes it (or as it is), and as a float32 one does.
Tensor autocast_lower(const Tensor& t);
Tensor autocast_widen(const Tensor& t);

}  // namespace gw
