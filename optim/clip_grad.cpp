#include "optim/clip_grad.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  GW_CHECK(norm_type > 0 && !std::isnan(norm_type), InvalidArgumentError,
           "[clip_grad_norm_] norm_type must be p > 0 or infinity, got ", norm_type);
  // Negative would turn the gradients around, NaN make them all NaN (PyTorch does both).
  GW_CHECK(max_norm >= 0, InvalidArgumentError,
           "[clip_grad_norm_] max_norm must be >= 0 (infinity: no clipping), got ", max_norm);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  if (grads.empty()) return scalar_tensor(0.0, kFloat32);
  // Each gradient's sum of |g|^p (or its largest |g|) in float64, as float16 squares would
  // overflow, on the first gradient's device; one read of the total (one sync on a GPU).
  const bool inf = std::isinf(norm_type);
  std::vector<Tensor> parts;
  for (const Tensor& g : grads) {
    const Tensor a = abs(g.to(kFloat64));
    parts.push_back((inf ? max(a) : pow(a, norm_type).sum()).to(grads[0].device()));
  }
  const Tensor all = stack(parts);
  const double total =
      inf ? max(all).item<double>() : std::pow(all.sum().item<double>(), 1 / norm_type);
  GW_CHECK(!error_if_nonfinite || std::isfinite(total), InvalidArgumentError,
           "[clip_grad_norm_] the total norm of order ", norm_type, " of the gradients is ", total,
           ", so they cannot be clipped (error_if_nonfinite)");
  const double scale = std::min(max_norm / (total + 1e-6), 1.0);
  if (scale != 1.0) {  // NaN too
    for (Tensor& g : grads) {
      if (g.element_size() == 2)  // 16-bit: scaled by the float32 factor (not rounded to 16 bits)
        g.copy_(g.to(kFloat32) * scale);
      else
        g.mul_(scale);
    }
  }
  return scalar_tensor(total, TensorOptions(grads[0].dtype()).with_device(grads[0].device()));
}

}  // namespace gw::optim
