#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/autograd.h"

namespace gw::autograd {

namespace {

std::vector<double> flat(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    GW_CHECK(inputs[i].requires_grad(), InvalidArgumentError, "[gradcheck] input ", i,
             " must require grad");
    // Elements are nudged in place through a flat view of the input itself.
    GW_CHECK(inputs[i].is_contiguous(), InvalidArgumentError, "[gradcheck] input ", i,
             " must be contiguous");
    // Central differences of 1e-6 in float32 are mostly rounding: every check would fail.
    GW_CHECK(inputs[i].dtype() == kFloat64, InvalidArgumentError, "[gradcheck] input ", i, " is ",
             inputs[i].dtype(), "; gradcheck needs float64 inputs");
  }
  const int64_t n_out = fn(inputs).numel();

  // Analytical Jacobian, one row per output element: grad of out.flatten()[k].
  std::vector<std::vector<std::vector<double>>> analytical(inputs.size());  // [input][k][j]
  for (int64_t k = 0; k < n_out; ++k) {
    Tensor y = fn(inputs);
    Tensor seed = zeros(y.sizes(), y.options());
    {
      NoGradGuard no_grad;
      seed.view({-1}).select(0, k).fill_(1.0);
    }
    GradOptions go;
    go.grad_outputs = {seed};
    go.allow_unused = true;
    std::vector<Tensor> g = grad({y}, inputs, go);
    for (size_t i = 0; i < inputs.size(); ++i) {
      analytical[i].push_back(g[i].defined() ? flat(g[i])
                                             : std::vector<double>(inputs[i].numel(), 0.0));
    }
  }

  // Numerical Jacobian, one column per input element, by central differences.
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i];
    for (int64_t j = 0; j < x.numel(); ++j) {
      std::vector<double> plus, minus;
      {
        NoGradGuard no_grad;
        Tensor e = x.view({-1}).select(0, j);
        const double orig = e.item<double>();
        struct Restore {  // the element as it was, also when fn throws
          Tensor& e;
          double value;
          ~Restore() { e.fill_(value); }
        } restore{e, orig};
        e.fill_(orig + options.eps);
        plus = flat(fn(inputs));
        e.fill_(orig - options.eps);
        minus = flat(fn(inputs));
      }
      for (int64_t k = 0; k < n_out; ++k) {
        double numerical = (plus[k] - minus[k]) / (2 * options.eps);
        double a = analytical[i][k][j];
        // Not within tolerance, written so that a NaN on either side fails.
        if (!(std::abs(a - numerical) <= options.atol + options.rtol * std::abs(numerical))) {
          return {false, detail::str("[gradcheck] input ", i, " element ", j, ", output element ",
                                     k, ": analytical ", a, " vs numerical ", numerical)};
        }
      }
    }
  }
  return {};
}

}  // namespace gw::autograd
