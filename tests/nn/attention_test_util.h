// Helpers of the attention tests (test_attention, test_attention_dropout_gqa): the scores made
// in full as the reference, a causal bias, one forward and backward under a fixed upstream
// gradient, and checks of its results and of refusals.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn_test_util.h"

namespace attention_test {

using gw::Tensor;
using nn_test::rel_error;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The reference: the scores made in full. `bias` is additive (or undefined).
inline Tensor attention_in_full(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& bias, double scale) {
  Tensor s = gw::matmul(q, k.transpose(-2, -1)) * scale;
  if (bias.defined()) s = s + bias;
  return gw::matmul(gw::softmax(s, -1), v);
}

// 0 where key j takes part in row i (j <= i), -inf elsewhere.
inline Tensor causal_bias(int64_t l, int64_t s) {
  std::vector<double> b(static_cast<size_t>(l * s));
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < s; ++j) b[static_cast<size_t>(i * s + j)] = j <= i ? 0 : kNegInf;
  return gw::from_vector(b, {l, s});
}

// Output and the gradients of q, k and v under a fixed upstream gradient.
inline std::vector<Tensor> run(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& f, const Tensor& q,
    const Tensor& k, const Tensor& v, const Tensor& gout) {
  std::vector<Tensor> leaves;
  for (const Tensor* t : {&q, &k, &v}) leaves.push_back(t->detach().requires_grad_());
  Tensor out = f(leaves[0], leaves[1], leaves[2]);
  (out * gout).sum().backward();
  return {out.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
}

// `f` throws a gradwire error that names the op and contains `part`.
inline void refused(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL("no error");
  } catch (const gw::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("[scaled_dot_product_attention]") != std::string::npos);
    CHECK(std::string(e.what()).find(part) != std::string::npos);
  }
}

// Each of got (output, then the gradients of q, k and v) against want, relative.
inline void check_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                       double tol) {
  const char* names[] = {"output", "grad q", "grad k", "grad v"};
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(names[i]);
    CHECK(rel_error(got[i], want[i]) < tol);
  }
}

}  // namespace attention_test
