// Elementwise activations as modules, for use in Sequential: ReLU, GELU, Tanh, Sigmoid.
//
//   auto mlp = std::make_shared<gw::nn::Sequential>(
//       std::make_shared<gw::nn::Linear>(4, 8, gen), std::make_shared<gw::nn::ReLU>(),
//       std::make_shared<gw::nn::Linear>(8, 2, gen));
#pragma once

#include <string>

#include "nn/module.h"

namespace gw::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

class GELU : public Module {
 public:
  // "none" (exact, with erf) or "tanh" (the approximation), as torch.nn.GELU.
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;

  const std::string approximate;

 protected:
  std::string extra_repr() const override { return "approximate='" + approximate + "'"; }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace gw::nn
