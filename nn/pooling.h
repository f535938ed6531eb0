// MaxPool2d: the maximum over sliding windows of (N,C,H,W) images.
//
//   gw::nn::MaxPool2d pool(2);                                 // 2x2 windows, stride 2
//   gw::nn::MaxPool2d padded(3, {.stride = 1, .padding = 1});  // same-size output
#pragma once

#include <optional>

#include "nn/conv.h"
#include "nn/module.h"

namespace gw::nn {

struct MaxPool2dOptions {
  std::optional<Size2> stride = std::nullopt;  // default: the kernel size
  Size2 padding = 0;                           // implicit -inf border, at most half the kernel
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, const MaxPool2dOptions& options = {});

  // (N,C,H,W) or unbatched (C,H,W).
  Tensor forward(const Tensor& input) override;

  const Size2 kernel_size;
  const Size2 stride;
  const Size2 padding;

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
