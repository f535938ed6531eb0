#include "nn/clip_grad.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::nn::utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  GW_CHECK(norm_type >= 0 && !std::isnan(norm_type), InvalidArgumentError,
           "[clip_grad_norm_] norm_type must be p >= 0 or infinity, got ", norm_type);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads, norms;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return scalar_tensor(0.0, kFloat32);
  const bool inf = std::isinf(norm_type);
  for (const Tensor& g : grads) {
    const Tensor a = abs(g).to(grads[0].dtype()).to(grads[0].device());
    norms.push_back(inf ? max(a) : pow(pow(a, norm_type).sum(), 1 / norm_type));
  }
  const Tensor all = stack(norms);
  const Tensor total = inf ? max(all) : pow(pow(all, norm_type).sum(), 1 / norm_type);
  const double value = total.item<double>();
  GW_CHECK(!error_if_nonfinite || std::isfinite(value), InvalidArgumentError,
           "[clip_grad_norm_] the total norm of order ", norm_type, " of the gradients is ", value,
           ", so they cannot be clipped (error_if_nonfinite)");
  const double scale = std::min(max_norm / (value + 1e-6), 1.0);
  for (Tensor& g : grads) g.mul_(scale);
  return total;
}

}  // namespace gw::nn::utils
