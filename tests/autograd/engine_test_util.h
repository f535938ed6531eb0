// Helpers shared by the engine test files: leaves, vectors, and stand-in nodes for the roots
// that distributed autograd adds (a send function fed from the network, a fixed root).
#pragma once

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/autograd.h"

namespace engine_test {

using gw::Tensor;
namespace ag = gw::autograd;

// A float64 tensor of `shape` (0-dim when empty) holding `v`, not requiring grad.
inline Tensor make(const std::vector<double>& v, gw::Shape shape) {
  if (shape.empty()) return gw::scalar_tensor(v.at(0), gw::kFloat64);
  return gw::from_vector<double>(v, shape);
}
inline Tensor leaf(std::vector<double> v) { return gw::from_vector(v).requires_grad_(); }
// The same as make(), requiring grad.
inline Tensor leaf(const std::vector<double>& v, gw::Shape shape) {
  return make(v, shape).requires_grad_();
}
inline Tensor constant(std::vector<double> v) { return gw::from_vector(v); }
inline std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

inline bool near(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <= tol * (1.0 + std::abs(b[i])))) return false;
  }
  return true;
}

// Stands in for distributed autograd's SendRpcBackward: a root of the backward pass whose
// gradient arrives from the network (here: another thread) and is passed on unchanged to
// the tensor that was sent.
class FakeSendBackward final : public ag::Node {
 public:
  explicit FakeSendBackward(const Tensor& sent) { next_edges = {ag::gradient_edge(sent)}; }
  ag::TensorList apply(ag::TensorList&& grads) override {
    std::lock_guard lock(mu);
    ++calls;
    received = grads[0];
    return {grads[0]};
  }
  std::string name() const override { return "FakeSendBackward"; }

  std::mutex mu;
  int calls = 0;
  Tensor received;
};

// A root that hands fixed gradients to the given edges (what the engine's own GraphRoot does).
class TestRoot final : public ag::Node {
 public:
  TestRoot(std::vector<ag::Edge> roots, std::vector<Tensor> grads) : grads_(std::move(grads)) {
    next_edges = std::move(roots);
    num_inputs = 0;
  }
  ag::TensorList apply(ag::TensorList&&) override { return grads_; }
  std::string name() const override { return "TestRoot"; }

 private:
  std::vector<Tensor> grads_;
};


}  // namespace engine_test
