// End to end: each optimizer minimizes a badly scaled quadratic through the autograd loop
// (zero_grad, forward, backward, step) and drives the loss from 32 to near zero.
#include <catch2/catch.hpp>

#include "optim_test_util.h"

using gw::Tensor;
using namespace gw::optim;

namespace {

// f(x) = sum(curvature * (x - target)^2): minimum 0 at x = target.
double minimize(const OptimizerOptions& options, int steps, double* initial) {
  Tensor curvature = gw::from_vector(std::vector<double>{0.5, 1.0, 2.0, 3.0});
  Tensor target = gw::from_vector(std::vector<double>{1.0, -2.0, 0.5, 3.0});
  Tensor x = gw::zeros({4}, gw::kFloat64).requires_grad_();
  auto opt = make_optimizer({x}, options);
  auto loss_fn = [&] { return (curvature * (x - target).pow(2)).sum(); };
  *initial = loss_fn().item<double>();
  for (int i = 0; i < steps; ++i) {
    opt->zero_grad();
    Tensor loss = loss_fn();
    loss.backward();
    opt->step();
  }
  gw::autograd::NoGradGuard no_grad;
  return loss_fn().item<double>();
}

}  // namespace

TEST_CASE("every optimizer minimizes a quadratic", "[optim][convergence]") {
  struct Run {
    const char* label;
    OptimizerOptions options;
    int steps;
  };
  // Learning rates of a typical size for each method; weight decay stays off because it moves
  // the minimum away from the target.
  std::vector<Run> runs = {
      {"SGD", SGDOptions{.lr = 0.1}, 200},
      {"SGD momentum", SGDOptions{.lr = 0.05, .momentum = 0.9}, 300},
      {"SGD nesterov", SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, 300},
      {"Adam", AdamOptions{.lr = 0.1}, 1000},
      {"Adam amsgrad", AdamOptions{.lr = 0.1, .amsgrad = true}, 1000},
      {"AdamW", AdamWOptions{.lr = 0.1, .weight_decay = 0}, 1000},
      {"Adagrad", AdagradOptions{.lr = 1.0}, 1000},
      {"RMSprop", RMSpropOptions{.lr = 0.01}, 1000},
      {"RMSprop centered momentum", RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true},
       1000},
  };
  for (const Run& run : runs) {
    INFO(run.label);
    double initial = 0;
    double final_loss = minimize(run.options, run.steps, &initial);
    CHECK(initial == 32.0);  // 0.5*1 + 1*4 + 2*0.25 + 3*9
    CHECK(final_loss < 1e-8);
  }
}
