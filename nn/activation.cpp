#include "nn/activation.h"

#include "nn/functional.h"

namespace gw::nn {

Tensor ReLU::forward(const Tensor& input) { return functional::relu(input); }

GELU::GELU(std::string approximate) : Module("GELU"), approximate(std::move(approximate)) {
  GW_CHECK(this->approximate == "none" || this->approximate == "tanh", InvalidArgumentError,
           "[GELU] approximate must be \"none\" or \"tanh\", got \"", this->approximate, "\"");
}

Tensor GELU::forward(const Tensor& input) { return functional::gelu(input, approximate); }

Tensor Tanh::forward(const Tensor& input) { return functional::tanh(input); }

Tensor Sigmoid::forward(const Tensor& input) { return functional::sigmoid(input); }

}  // namespace gw::nn
