// gw::nn::init — in-place initializers with the formulas of torch.nn.init.
//
// Each fills an existing tensor (a parameter, usually) under NoGradGuard and returns it; the
// random ones draw from an explicit Generator so that a seed fixes a model's initial weights.
//
//   gw::Generator gen(0);
//   namespace init = gw::nn::init;
//   init::kaiming_uniform_(linear->weight, gen, {.a = std::sqrt(5.0)});  // PyTorch's default
//   init::zeros_(linear->bias);
#pragma once

#include <optional>

#include "core/random.h"
#include "core/tensor.h"

namespace gw::nn::init {

enum class Nonlinearity {
  kLinear,
  kConv1d,
  kConv2d,
  kConv3d,
  kSigmoid,
  kTanh,
  kReLU,
  kLeakyReLU,
  kSELU,
};
enum class FanMode { kFanIn, kFanOut };

// torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 for tanh, sqrt(2) for ReLU,
// sqrt(2 / (1 + slope^2)) for leaky ReLU (slope = param, default 0.01), 3/4 for SELU.
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = std::nullopt);

struct Fans {
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
// For a weight (out, in, k...): fan_in = in * prod(k), fan_out = out * prod(k). Needs dim >= 2.
Fans calculate_fan_in_and_fan_out(const Tensor& tensor);

struct KaimingOptions {
  double a = 0;  // negative slope of the leaky ReLU that follows (used by the gain)
  FanMode mode = FanMode::kFanIn;
  Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU;
};

Tensor uniform_(Tensor tensor, Generator& gen, double a = 0, double b = 1);  // U(a, b)
Tensor normal_(Tensor tensor, Generator& gen, double mean = 0, double std = 1);
Tensor constant_(Tensor tensor, double value);
Tensor zeros_(Tensor tensor);
Tensor ones_(Tensor tensor);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor tensor, Generator& gen, double gain = 1);
// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor tensor, Generator& gen, double gain = 1);
// U(-b, b) with b = gain * sqrt(3 / fan), gain from calculate_gain(nonlinearity, a).
Tensor kaiming_uniform_(Tensor tensor, Generator& gen, const KaimingOptions& options = {});
// N(0, std^2) with std = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor tensor, Generator& gen, const KaimingOptions& options = {});

}  // namespace gw::nn::init
