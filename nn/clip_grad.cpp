#include "nn/clip_grad.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::nn::utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  GW_CHECK(norm_type > 0 && !std::isnan(norm_type), InvalidArgumentError,
           "[clip_grad_norm_] norm_type must be p > 0 or infinity, got ", norm_type);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return scalar_tensor(0.0, kFloat32);
  // Each gradient's norm in float64 (a float16 gradient's squares would overflow in its own
  // dtype), then the norm of those norms.
  const bool inf = std::isinf(norm_type);
  double total = 0;
  for (const Tensor& g : grads) {
    const Tensor a = abs(g.to(kFloat64));
    const double norm = inf ? max(a).item<double>()
                            : std::pow(pow(a, norm_type).sum().item<double>(), 1 / norm_type);
    total = inf ? std::max(total, norm) : total + std::pow(norm, norm_type);
    if (std::isnan(norm)) total = norm;
  }
  if (!inf) total = std::pow(total, 1 / norm_type);
  GW_CHECK(!error_if_nonfinite || std::isfinite(total), InvalidArgumentError,
           "[clip_grad_norm_] the total norm of order ", norm_type, " of the gradients is ", total,
           ", so they cannot be clipped (error_if_nonfinite)");
  const double scale = std::min(max_norm / (total + 1e-6), 1.0);
  for (Tensor& g : grads) {
    if (g.element_size() == 2)  // 16-bit storage: scaled in float32 (the CPU has no 16-bit mul)
      g.copy_(g.to(kFloat32) * scale);
    else
      g.mul_(scale);
  }
  return scalar_tensor(total, TensorOptions(grads[0].dtype()).with_device(grads[0].device()));
}

}  // namespace gw::nn::utils
