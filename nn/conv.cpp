#include "nn/conv.h"

#include <cmath>

#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

std::string Size2::tuple_str() const { return detail::str("(", h, ", ", w, ")"); }

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Generator& gen)
    : Conv2d(in_channels, out_channels, kernel_size, Conv2dOptions{}, true, gen) {}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
               const Conv2dOptions& options, Generator& gen)
    : Conv2d(in_channels, out_channels, kernel_size, options, true, gen) {}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
               const Conv2dOptions& options, bool bias)
    : Conv2d(in_channels, out_channels, kernel_size, options, bias, default_generator()) {}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
               const Conv2dOptions& options, bool bias, Generator& gen)
    : Module("Conv2d"),
      in_channels(in_channels),
      out_channels(out_channels),
      kernel_size(kernel_size),
      options(options) {
  GW_CHECK(in_channels > 0 && out_channels > 0, InvalidArgumentError,
           "[Conv2d] in_channels and out_channels must be positive, got ", in_channels, " and ",
           out_channels);
  GW_CHECK(kernel_size.h > 0 && kernel_size.w > 0 && options.stride[0] > 0 &&
               options.stride[1] > 0 && options.dilation[0] > 0 && options.dilation[1] > 0 &&
               options.padding[0] >= 0 && options.padding[1] >= 0,
           InvalidArgumentError,
           "[Conv2d] kernel_size, stride and dilation must be positive and padding non-negative, "
           "got kernel_size ",
           kernel_size.tuple_str(), ", stride ", Size2(options.stride).tuple_str(), ", padding ",
           Size2(options.padding).tuple_str(), ", dilation ", Size2(options.dilation).tuple_str());
  weight = register_parameter("weight",
                              empty({out_channels, in_channels, kernel_size.h, kernel_size.w}));
  if (bias) this->bias = register_parameter("bias", empty({out_channels}));
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator& gen) {
  init::kaiming_uniform_(weight, gen, {.a = std::sqrt(5.0)});
  if (bias.defined()) {
    double fan_in = static_cast<double>(init::calculate_fan_in_and_fan_out(weight).fan_in);
    double bound = 1 / std::sqrt(fan_in);
    init::uniform_(bias, gen, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  bool fits = (input.dim() == 4 && input.size(1) == in_channels) ||
              (input.dim() == 3 && input.size(0) == in_channels);
  GW_CHECK(fits, ShapeError, "[Conv2d] expected an (N,", in_channels, ",H,W) or (", in_channels,
           ",H,W) input (in_channels=", in_channels, "), got shape ", shape_str(input.sizes()));
  return functional::conv2d(input, weight, bias, options);
}

std::string Conv2d::extra_repr() const {
  // PyTorch's Conv2d.extra_repr: padding and dilation only when not the default.
  std::string s =
      detail::str(in_channels, ", ", out_channels, ", kernel_size=", kernel_size.tuple_str(),
                  ", stride=", Size2(options.stride).tuple_str());
  if (options.padding != std::array<int64_t, 2>{0, 0}) {
    s += ", padding=" + Size2(options.padding).tuple_str();
  }
  if (options.dilation != std::array<int64_t, 2>{1, 1}) {
    s += ", dilation=" + Size2(options.dilation).tuple_str();
  }
  if (!bias.defined()) s += ", bias=False";
  return s;
}

}  // namespace gw::nn
