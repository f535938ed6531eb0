// Helpers shared by the optim tests: element-wise comparison with a readable failure, and one
// configuration of every optimizer for the tests that loop over all of them.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "optim/optim.h"

namespace optim_test {

// |actual - expected| <= tol + tol * |expected| element-wise (tol = 0: bitwise equal values).
inline void check_close(const gw::Tensor& actual, const gw::Tensor& expected, double tol,
                        const std::string& what) {
  INFO(what);
  REQUIRE(actual.sizes() == expected.sizes());
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double worst = 0;
  size_t worst_at = 0;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::abs(a[i] - e[i]);
    if (!(err <= tol + tol * std::abs(e[i]))) ok = false;
    if (!(err <= worst)) worst = err, worst_at = i;
  }
  std::ostringstream msg;
  msg.precision(17);
  if (!a.empty()) {
    msg << "worst error " << worst << " at element " << worst_at << ": got " << a[worst_at]
        << ", expected " << e[worst_at];
  }
  INFO(msg.str());
  CHECK(ok);
}

struct Config {
  std::string label;
  gw::optim::OptimizerOptions options;
};

// Every optimizer, each with its stateful features switched on.
inline std::vector<Config> all_configs() {
  using namespace gw::optim;
  return {
      {"SGD momentum nesterov", SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}},
      {"Adam amsgrad", AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}},
      {"AdamW", AdamWOptions{.lr = 0.01}},
      {"Adagrad", AdagradOptions{.lr = 0.1, .lr_decay = 0.1, .initial_accumulator_value = 0.1}},
      {"RMSprop centered momentum", RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true}},
  };
}

// Two fresh leaf parameters, float64, shapes (2,3) and (4).
inline std::vector<gw::Tensor> make_params() {
  return {gw::from_vector(std::vector<double>{0.5, -1.0, 1.5, 2.0, -0.25, 0.75}, {2, 3})
              .requires_grad_(),
          gw::from_vector(std::vector<double>{-2.0, 1.0, 0.125, 3.0}).requires_grad_()};
}

inline std::vector<gw::Tensor> clone_params(const std::vector<gw::Tensor>& params) {
  std::vector<gw::Tensor> out;
  for (const gw::Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// The k-th of a fixed sequence of gradients for make_params()'s shapes (varies with k).
inline std::vector<gw::Tensor> fixed_grads(int k) {
  double s = 1.0 + 0.5 * k, sign = (k % 2 == 0) ? 1.0 : -1.0;
  return {
      gw::from_vector(std::vector<double>{0.3 * s, -0.7, 0.2 * sign, 1.1, -0.4 * s, 0.9}, {2, 3}),
      gw::from_vector(std::vector<double>{-0.5 * sign, 0.6, 0.8 * s, -0.1})};
}

inline gw::optim::GradMap grad_map(const std::vector<gw::Tensor>& params,
                                   const std::vector<gw::Tensor>& grads) {
  gw::optim::GradMap map;
  for (size_t i = 0; i < params.size(); ++i) map.emplace(params[i], grads[i]);
  return map;
}

}  // namespace optim_test
