// Linear: y = x W^T + b, with PyTorch's default initialization.
//
//   gw::Generator gen(0);
//   auto fc = std::make_shared<gw::nn::Linear>(784, 128, gen);
//   gw::Tensor y = fc->forward(x);  // x (N, 784) -> y (N, 128); any leading dims work
#pragma once

#include "core/random.h"
#include "nn/module.h"

namespace gw::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen);
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen);
  // Draws from gw::default_generator().
  Linear(int64_t in_features, int64_t out_features, bool bias = true);

  // x (..., in_features) -> (..., out_features).
  Tensor forward(const Tensor& input) override;
  // PyTorch's init: weight kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)),
  // and bias U(-1/sqrt(in), 1/sqrt(in)).
  void reset_parameters(Generator& gen);
  // Shares `weight` (out_features, in_features), e.g. an Embedding's, as this layer's weight
  // (weight tying: a language model's output head reads the token embedding). See
  // Module::tie_parameter.
  void tie_weight(const Tensor& weight);

  const int64_t in_features;
  const int64_t out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features), undefined when built without one

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
