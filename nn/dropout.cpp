#include "nn/dropout.h"

#include "nn/functional.h"

namespace gw::nn {

Dropout::Dropout(double p, Generator& gen) : Module("Dropout"), p(p), gen_(&gen) {
  GW_CHECK(p >= 0 && p <= 1, InvalidArgumentError, "[Dropout] p must be in [0, 1], got ", p);
}

Dropout::Dropout(double p) : Dropout(p, default_generator()) {}

Tensor Dropout::forward(const Tensor& input) {
  return functional::dropout(input, p, is_training(), *gen_);
}

std::string Dropout::extra_repr() const { return "p=" + float_repr(p) + ", inplace=False"; }

}  // namespace gw::nn
