// clip_grad_norm_, as torch.nn.utils.clip_grad_norm_ (here beside the optimizers it feeds):
// scales the gradients of `parameters` in place so that their total norm (the norm of the
// per-parameter norms) is at most max_norm, and returns the total norm from before, as a 0-dim
// tensor of the gradients' dtype.
//
//   loss.backward();
//   gw::Tensor norm = gw::optim::clip_grad_norm_(model->parameters(), 1.0);
//   opt.step();
//
// norm_type is p > 0 or infinity (the largest |g|); each gradient's norm is taken in float64.
// Parameters without a gradient are skipped; with none at all the norm is 0. The scale is
// max_norm / (norm + 1e-6), clamped to 1, as PyTorch's. A NaN or infinite norm is applied all
// the same (the gradients become NaN or zero, as in PyTorch), unless error_if_nonfinite: then
// InvalidArgumentError, nothing changed.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace gw::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace gw::optim
