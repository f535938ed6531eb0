#include "nn/flatten.h"

#include <algorithm>

#include "nn/functional.h"

namespace gw::nn {

Flatten::Flatten(int64_t start_dim, int64_t end_dim)
    : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}

Tensor Flatten::forward(const Tensor& input) {
  // A 0-dim input flattens like a 1-element vector, as in PyTorch.
  const int64_t n = std::max<int64_t>(input.dim(), 1);
  auto in_range = [n](int64_t d) { return d >= -n && d < n; };
  GW_CHECK(in_range(start_dim) && in_range(end_dim), IndexError, "[Flatten] start_dim ", start_dim,
           " or end_dim ", end_dim, " is out of range for an input of shape ",
           shape_str(input.sizes()));
  const int64_t s = start_dim < 0 ? start_dim + n : start_dim;
  const int64_t e = end_dim < 0 ? end_dim + n : end_dim;
  GW_CHECK(s <= e, InvalidArgumentError, "[Flatten] start_dim ", start_dim, " comes after end_dim ",
           end_dim, " for an input of shape ", shape_str(input.sizes()));
  return functional::flatten(input, start_dim, end_dim);
}

std::string Flatten::extra_repr() const {
  return detail::str("start_dim=", start_dim, ", end_dim=", end_dim);
}

}  // namespace gw::nn
