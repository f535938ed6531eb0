#include "nn/linear.h"

#include <cmath>

#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen)
    : Linear(in_features, out_features, true, gen) {}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Linear(in_features, out_features, bias, default_generator()) {}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen)
    : Module("Linear"), in_features(in_features), out_features(out_features) {
  GW_CHECK(in_features >= 0 && out_features >= 0, InvalidArgumentError,
           "[Linear] in_features and out_features must be non-negative, got ", in_features, " and ",
           out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", empty({out_features}));
  reset_parameters(gen);
}

void Linear::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight, gen, {.a = std::sqrt(5.0)});
  if (bias.defined()) {
    double fan_in = static_cast<double>(in_features);
    double bound = fan_in > 0 ? 1 / std::sqrt(fan_in) : 0;
    init::uniform_(bias, gen, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) {
  GW_CHECK(input.dim() >= 1 && input.size(-1) == in_features, ShapeError,
           "[Linear] expected input with last dimension ", in_features,
           " (in_features), got shape ", shape_str(input.sizes()));
  return functional::linear(input, weight, bias);
}

void Linear::tie_weight(const Tensor& shared) { weight = tie_parameter("weight", shared); }

std::string Linear::extra_repr() const {
  return detail::str("in_features=", in_features, ", out_features=", out_features,
                     ", bias=", bias.defined() ? "True" : "False");
}

}  // namespace gw::nn
