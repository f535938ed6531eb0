// Flatten: merges dims start_dim..end_dim into one; by default everything but the batch dim,
// as torch.nn.Flatten: (N,C,H,W) -> (N, C*H*W).
#pragma once

#include "nn/module.h"

namespace gw::nn {

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);

  Tensor forward(const Tensor& input) override;

  const int64_t start_dim;
  const int64_t end_dim;

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
