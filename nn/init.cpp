#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/ops.h"

namespace gw::nn::init {

namespace {

void check_defined(const Tensor& t, const char* op) {
  GW_CHECK(t.defined(), InvalidArgumentError, "[", op, "] the tensor is undefined");
}

void check_floating(const Tensor& t, const char* op) {
  check_defined(t, op);
  GW_CHECK(t.is_floating_point(), DTypeError, "[", op, "] needs a floating point tensor, got ",
           t.dtype());
}

int64_t fan(const Tensor& t, FanMode mode) {
  Fans f = calculate_fan_in_and_fan_out(t);
  return mode == FanMode::kFanIn ? f.fan_in : f.fan_out;
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kConv1d:
    case Nonlinearity::kConv2d:
    case Nonlinearity::kConv3d:
    case Nonlinearity::kSigmoid:
      return 1;
    case Nonlinearity::kTanh:
      return 5.0 / 3;
    case Nonlinearity::kReLU:
      return std::sqrt(2.0);
    case Nonlinearity::kLeakyReLU: {
      double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1 + slope * slope));
    }
    case Nonlinearity::kSELU:
      return 3.0 / 4;
  }
  throw InvalidArgumentError("[calculate_gain] unknown nonlinearity");
}

Fans calculate_fan_in_and_fan_out(const Tensor& tensor) {
  check_defined(tensor, "calculate_fan_in_and_fan_out");
  GW_CHECK(tensor.dim() >= 2, InvalidArgumentError,
           "[calculate_fan_in_and_fan_out] fan in and fan out can not be computed for a tensor "
           "with fewer than 2 dimensions, got shape ",
           shape_str(tensor.sizes()));
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

Tensor uniform_(Tensor tensor, Generator& gen, double a, double b) {
  check_floating(tensor, "uniform_");
  autograd::NoGradGuard no_grad;
  gw::uniform_(tensor, a, b, gen);
  return tensor;
}

Tensor normal_(Tensor tensor, Generator& gen, double mean, double std) {
  check_floating(tensor, "normal_");
  autograd::NoGradGuard no_grad;
  gw::normal_(tensor, mean, std, gen);
  return tensor;
}

Tensor constant_(Tensor tensor, double value) {
  check_defined(tensor, "constant_");
  autograd::NoGradGuard no_grad;
  tensor.fill_(value);
  return tensor;
}

Tensor zeros_(Tensor tensor) { return constant_(std::move(tensor), 0); }
Tensor ones_(Tensor tensor) { return constant_(std::move(tensor), 1); }

Tensor xavier_uniform_(Tensor tensor, Generator& gen, double gain) {
  Fans f = calculate_fan_in_and_fan_out(tensor);
  double std = gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out));
  double bound = std::sqrt(3.0) * std;  // U(-b, b) has standard deviation b / sqrt(3)
  return uniform_(std::move(tensor), gen, -bound, bound);
}

Tensor xavier_normal_(Tensor tensor, Generator& gen, double gain) {
  Fans f = calculate_fan_in_and_fan_out(tensor);
  double std = gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out));
  return normal_(std::move(tensor), gen, 0, std);
}

Tensor kaiming_uniform_(Tensor tensor, Generator& gen, const KaimingOptions& options) {
  check_defined(tensor, "kaiming_uniform_");
  if (tensor.numel() == 0) return tensor;  // PyTorch only warns: nothing to fill
  double std = calculate_gain(options.nonlinearity, options.a) /
               std::sqrt(static_cast<double>(fan(tensor, options.mode)));
  double bound = std::sqrt(3.0) * std;
  return uniform_(std::move(tensor), gen, -bound, bound);
}

Tensor kaiming_normal_(Tensor tensor, Generator& gen, const KaimingOptions& options) {
  check_defined(tensor, "kaiming_normal_");
  if (tensor.numel() == 0) return tensor;
  double std = calculate_gain(options.nonlinearity, options.a) /
               std::sqrt(static_cast<double>(fan(tensor, options.mode)));
  return normal_(std::move(tensor), gen, 0, std);
}

}  // namespace gw::nn::init
