// Conv2d: 2-D convolution over (N,C,H,W) images, with PyTorch's default initialization.
//
//   auto conv = std::make_shared<gw::nn::Conv2d>(1, 4, 3, gw::Conv2dOptions{.padding = {1, 1}},
//                                                gen);
//   gw::Tensor y = conv->forward(x);  // (N,1,28,28) -> (N,4,28,28)
//
// Note that gw::Conv2dOptions holds std::arrays: write {.padding = {1, 1}}, since {1} alone
// means (1, 0).
#pragma once

#include <array>
#include <string>

#include "core/ops/conv.h"
#include "core/random.h"
#include "nn/module.h"

namespace gw::nn {

// A (height, width) pair that a single number also gives, like PyTorch's `int or tuple`.
struct Size2 {
  int64_t h = 0;
  int64_t w = 0;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT: Conv2d(1, 4, 3)
  Size2(int64_t h, int64_t w) : h(h), w(w) {}
  Size2(std::array<int64_t, 2> hw) : h(hw[0]), w(hw[1]) {}  // NOLINT
  std::array<int64_t, 2> array() const { return {h, w}; }
  bool operator==(const Size2&) const = default;
  // "(3, 3)", as a Python tuple prints.
  std::string tuple_str() const;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Generator& gen);
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const Conv2dOptions& options,
         Generator& gen);
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const Conv2dOptions& options,
         bool bias, Generator& gen);
  // Draws from gw::default_generator().
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
         const Conv2dOptions& options = {}, bool bias = true);

  // (N, in_channels, H, W) or unbatched (in_channels, H, W).
  Tensor forward(const Tensor& input) override;
  // PyTorch's init: weight kaiming_uniform_(a = sqrt(5)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  // with fan_in = in_channels * kh * kw.
  void reset_parameters(Generator& gen);

  const int64_t in_channels;
  const int64_t out_channels;
  const Size2 kernel_size;
  const Conv2dOptions options;
  Tensor weight;  // (out_channels, in_channels, kh, kw)
  Tensor bias;    // (out_channels), undefined when built without one

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
