#include "nn/pooling.h"

#include "nn/functional.h"

namespace gw::nn {

namespace {
// PyTorch keeps what the user passed: MaxPool2d(2) prints kernel_size=2, not (2, 2).
std::string int_or_tuple(const Size2& s) {
  return s.h == s.w ? std::to_string(s.h) : s.tuple_str();
}
}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel_size, const MaxPool2dOptions& options)
    : Module("MaxPool2d"),
      kernel_size(kernel_size),
      stride(options.stride.value_or(kernel_size)),
      padding(options.padding) {
  GW_CHECK(kernel_size.h > 0 && kernel_size.w > 0 && stride.h > 0 && stride.w > 0,
           InvalidArgumentError, "[MaxPool2d] kernel_size and stride must be positive, got ",
           kernel_size.tuple_str(), " and ", stride.tuple_str());
  GW_CHECK(padding.h >= 0 && padding.w >= 0 && padding.h <= kernel_size.h / 2 &&
               padding.w <= kernel_size.w / 2,
           InvalidArgumentError, "[MaxPool2d] padding ", padding.tuple_str(),
           " must be non-negative and at most half of kernel_size ", kernel_size.tuple_str());
}

Tensor MaxPool2d::forward(const Tensor& input) {
  GW_CHECK(input.dim() == 3 || input.dim() == 4, ShapeError,
           "[MaxPool2d] expected an (N,C,H,W) or (C,H,W) input, got shape ",
           shape_str(input.sizes()));
  return functional::max_pool2d(input, kernel_size.array(), stride.array(), padding.array());
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + int_or_tuple(kernel_size) + ", stride=" + int_or_tuple(stride) +
         ", padding=" + int_or_tuple(padding) + ", dilation=1, ceil_mode=False";
}

}  // namespace gw::nn
