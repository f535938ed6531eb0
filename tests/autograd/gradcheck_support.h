// Helpers for the finite-difference tests of the derivative rules (test_gradcheck_*.cpp):
// deterministic float64 inputs that keep away from the points where an op is not
// differentiable, and a check that runs gw::autograd::gradcheck after making sure each
// gradient has its input's shape and dtype (gradcheck reads gradients as flat vectors).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "tests/autograd/engine_test_util.h"

namespace gwtest {

using gw::Shape;
using gw::Tensor;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

using engine_test::leaf;
using engine_test::make;
using engine_test::near;
using engine_test::vec;

// Uniform values in [lo, hi) that stay at least `margin` away from every point in `avoid`
// (kinks, bounds, integers): a central difference never straddles one.
inline std::vector<double> sample(int64_t n, uint64_t seed, double lo, double hi,
                                  const std::vector<double>& avoid = {}, double margin = 0.05) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v;
  while (static_cast<int64_t>(v.size()) < n) {
    double x = dist(rng);
    bool ok = true;
    for (double p : avoid) ok = ok && std::abs(x - p) >= margin;
    if (ok) v.push_back(x);
  }
  return v;
}

// A leaf of uniform values (see sample).
inline Tensor uniform(Shape shape, uint64_t seed, double lo = -1.0, double hi = 1.0,
                      const std::vector<double>& avoid = {}, double margin = 0.05) {
  return leaf(sample(gw::numel(shape), seed, lo, hi, avoid, margin), shape);
}

// Magnitudes in [0.3, 1.5) with random signs: safe for abs, relu, reciprocal, division.
inline Tensor nonzero(Shape shape, uint64_t seed) {
  std::vector<double> v = sample(gw::numel(shape), seed, 0.3, 1.5);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  for (double& x : v) x = (rng() & 1) ? -x : x;
  return leaf(v, shape);
}

// Pairwise distinct values spaced at least 0.1 apart, shuffled: no ties for max/min.
inline Tensor distinct(Shape shape, uint64_t seed) {
  const int64_t n = gw::numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = -1.0 + 0.17 * static_cast<double>(i);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return leaf(v, shape);
}

inline Tensor int_index(const std::vector<int64_t>& v, Shape shape = {}) {
  return gw::from_vector<int64_t>(v, shape);
}

inline Tensor bool_mask(const std::vector<bool>& v, Shape shape = {}) {
  return gw::from_vector<bool>(v, shape);
}

// gradcheck of fn at inputs, after checking that one backward pass gives every input a
// gradient of its own shape and dtype. Failures name `what`; exceptions count as failures.
inline void expect_gradcheck(const std::string& what, const Fn& fn,
                             const std::vector<Tensor>& inputs,
                             gw::autograd::GradcheckOptions options = {}) {
  INFO("gradcheck of " << what);
  try {
    Tensor y = fn(inputs);
    CHECK(y.requires_grad());
    if (!y.requires_grad()) return;
    Tensor seed;
    {
      gw::autograd::NoGradGuard no_grad;
      seed = gw::ones_like(y);
    }
    gw::autograd::GradOptions go;
    go.grad_outputs = {seed};
    go.allow_unused = true;
    std::vector<Tensor> g = gw::autograd::grad({y}, inputs, go);
    REQUIRE(g.size() == inputs.size());
    bool shapes_ok = true;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!g[i].defined()) continue;
      INFO("input " << i << ": gradient shape " << gw::shape_str(g[i].sizes()) << " dtype "
                    << g[i].dtype() << ", input shape " << gw::shape_str(inputs[i].sizes())
                    << " dtype " << inputs[i].dtype());
      CHECK(g[i].sizes() == inputs[i].sizes());
      CHECK(g[i].dtype() == inputs[i].dtype());
      shapes_ok = shapes_ok && g[i].sizes() == inputs[i].sizes();
    }
    if (!shapes_ok) return;  // gradcheck would read past the gradient
    gw::autograd::GradcheckResult r = gw::autograd::gradcheck(fn, inputs, options);
    INFO(r.message);
    CHECK(r.ok);
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

}  // namespace gwtest
