#include "core/autocast.h"

#include "core/error.h"

namespace gw {

namespace detail {

thread_local constinit AutocastState t_autocast __attribute__((tls_model("initial-exec")));

namespace {
// Lowered: a floating tensor other than float64 and not in the autocast dtype already (float16
// under bfloat16 autocast too, as PyTorch's); widened: a 16-bit one.
bool converted(const Tensor& t, bool lower) {
  if (!t.defined() || !is_autocast_enabled(t.device().type)) return false;
  const DType d = t.dtype();
  return lower ? is_floating(d) && d != kFloat64 && d != autocast_dtype(t.device().type)
               : is_16_bit_float(d);
}

void check_dtype(DType dtype) {
  GW_CHECK(is_16_bit_float(dtype), InvalidArgumentError,
           "[autocast] dtype must be bfloat16 or float16, got ", dtype);
}
}  // namespace

bool autocast_converts(std::initializer_list<const Tensor*> ts, bool lower) {
  for (const Tensor* t : ts) {
    if (converted(*t, lower)) return true;
  }
  return false;
}

}  // namespace detail

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled)
    : saved_(detail::t_autocast) {
  if (enabled) detail::check_dtype(dtype);  // a disabled guard ignores it, as torch.autocast
  detail::t_autocast.enabled[static_cast<int>(device)] = enabled;
  if (enabled) detail::t_autocast.dtype[static_cast<int>(device)] = dtype;
}

AutocastGuard::AutocastGuard(const AutocastState& state) : saved_(detail::t_autocast) {
  for (int d = 0; d < kNumDeviceTypes; ++d)
    if (state.enabled[d]) detail::check_dtype(state.dtype[d]);
  detail::t_autocast = state;
}

Tensor autocast_lower(const Tensor& t) {
  return detail::converted(t, true) ? t.to(autocast_dtype(t.device().type)) : t;
}

Tensor autocast_widen(const Tensor& t) { return detail::converted(t, false) ? t.to(kFloat32) : t; }

}  // namespace gw
