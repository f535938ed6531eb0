// Finite-difference checks of autograd's gradients. Inputs should be float64 and require grad;
// each input element is nudged by ±eps and the central difference of every output element is
// compared with the Jacobian that backward computes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace gw::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytical vs numerical
  explicit operator bool() const { return ok; }
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace gw::autograd
