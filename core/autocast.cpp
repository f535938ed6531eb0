#include "core/autocast.h"

#include "core/error.h"

namespace gw {

namespace detail {

thread_local constinit AutocastState t_autocast __attribute__((tls_model("initial-exec")));

namespace {
bool converted(const Tensor& t, bool lower) {
  if (!t.defined() || !is_autocast_enabled(t.device().type)) return false;
  return lower ? t.dtype() == kFloat32 : (t.dtype() == kBFloat16 || t.dtype() == kFloat16);
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
  GW_CHECK(dtype == kBFloat16 || dtype == kFloat16, InvalidArgumentError,
           "[autocast] dtype must be bfloat16 or float16, got ", dtype);
  detail::t_autocast.enabled[static_cast<int>(device)] = enabled;
  detail::t_autocast.dtype[static_cast<int>(device)] = dtype;
}

AutocastGuard::AutocastGuard(const AutocastState& state) : saved_(detail::t_autocast) {
  detail::t_autocast = state;
}

Tensor autocast_lower(const Tensor& t) {
  return t.defined() && t.dtype() == kFloat32 && is_autocast_enabled(t.device().type)
             ? t.to(autocast_dtype(t.device().type))
             : t;
}

Tensor autocast_widen(const Tensor& t) {
  return t.defined() && (t.dtype() == kBFloat16 || t.dtype() == kFloat16) &&
                 is_autocast_enabled(t.device().type)
             ? t.to(kFloat32)
             : t;
}

}  // namespace gw
