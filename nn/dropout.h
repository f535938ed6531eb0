// Dropout: in training mode, zeroes each element with probability p and scales the others by
// 1/(1-p); in eval mode, the identity. The mask is drawn from the generator given at
// construction (which must outlive the module), so a seed makes it reproducible.
//
//   gw::Generator gen(7);
//   auto drop = std::make_shared<gw::nn::Dropout>(0.5, gen);
//   model->eval();  // Dropout in the model now passes inputs through
#pragma once

#include "core/random.h"
#include "nn/module.h"

namespace gw::nn {

class Dropout : public Module {
 public:
  Dropout(double p, Generator& gen);
  explicit Dropout(double p = 0.5);  // draws from gw::default_generator()

  Tensor forward(const Tensor& input) override;

  const double p;

 protected:
  std::string extra_repr() const override;

 private:
  Generator* gen_;
};

}  // namespace gw::nn
