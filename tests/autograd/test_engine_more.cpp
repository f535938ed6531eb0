// The engine beyond single chains: leaves shared by branches and by one op, hook order,
// retain_grad, post-accumulate hooks (DDP's readiness signal and its order), concurrent
// backward passes, autograd::grad's options, the errors, grad-mode guards, and the GraphTask
// API that distributed autograd drives (an extra root fed from another thread, a leaf sink).
#include <catch2/catch.hpp>

#include <atomic>
#include <barrier>
#include <cmath>
#include <latch>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "autograd/autograd.h"

using gw::Tensor;
namespace ag = gw::autograd;

namespace {

Tensor leaf(std::vector<double> v) { return gw::from_vector(v).requires_grad_(); }
Tensor leaf(std::vector<double> v, gw::Shape shape) {
  return gw::from_vector(v, shape).requires_grad_();
}
Tensor constant(std::vector<double> v) { return gw::from_vector(v); }
std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

bool near(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
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

}  // namespace

// --- sharing ----------------------------------------------------------------------------------

TEST_CASE("a leaf shared by several branches gets the sum of their gradients once",
          "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0}), w = leaf({3.0, -1.0});
  int x_fired = 0, w_fired = 0;
  std::vector<double> x_seen;
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor& p) {
    ++x_fired;
    x_seen = vec(p.grad());
  });
  ag::register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++w_fired; });
  // d/dx = w + 4x + cos(x); d/dw = x
  Tensor y = (x * w).sum() + (x * x * 2.0).sum() + gw::sin(x).sum();
  y.backward();
  std::vector<double> expect_x = {3.0 + 4.0 + std::cos(1.0), -1.0 + 8.0 + std::cos(2.0)};
  CHECK(near(vec(x.grad()), expect_x));
  CHECK(vec(w.grad()) == std::vector<double>{1.0, 2.0});
  CHECK(x_fired == 1);
  CHECK(w_fired == 1);
  CHECK(near(x_seen, expect_x));
}

TEST_CASE("shared intermediates at several depths", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0, -1.0});
  Tensor h = x * 2.0;
  Tensor a = h * 3.0, b = h * h;
  Tensor c = a + b;
  Tensor y = c.sum() + h.sum() + (c * h).sum();
  // dy/dh = dc/dh (1 + h) + 1 + c = (3 + 2h)(1 + h) + 1 + 3h + h^2; dy/dx = 2 dy/dh
  y.backward();
  std::vector<double> expect;
  for (double xv : {1.0, 2.0, -1.0}) {
    double hv = 2 * xv;
    expect.push_back(2 * ((3 + 2 * hv) * (1 + hv) + 1 + 3 * hv + hv * hv));
  }
  CHECK(near(vec(x.grad()), expect));
}

TEST_CASE("backward from several roots at once sums their gradients", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y1 = (x * 3.0).sum(), y2 = x * x;
  ag::backward({y1, y2}, {Tensor(), constant({10.0, 100.0})});
  CHECK(vec(x.grad()) == std::vector<double>{3.0 + 20.0, 3.0 + 400.0});
}

TEST_CASE("a leaf used twice in one op", "[autograd][engine]") {
  SECTION("x * x gives 2x, and the leaf's hooks run once with the sum") {
    Tensor x = leaf({1.5, -2.0});
    int hook_calls = 0, post_calls = 0;
    std::vector<double> hook_saw;
    x.register_hook([&](const Tensor& g) {
      ++hook_calls;
      hook_saw = vec(g);
      return Tensor();
    });
    ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_calls; });
    (x * x).sum().backward();
    CHECK(vec(x.grad()) == std::vector<double>{3.0, -4.0});
    CHECK(hook_calls == 1);
    CHECK(hook_saw == std::vector<double>{3.0, -4.0});
    CHECK(post_calls == 1);
  }
  SECTION("x - x and x / x give 0, pow(x, x) gives x^x (log x + 1)") {
    Tensor x = leaf({0.5, 2.0});
    (x - x).sum().backward();
    CHECK(vec(x.grad()) == std::vector<double>{0.0, 0.0});
    x.set_grad({});
    (x / x).sum().backward();
    CHECK(near(vec(x.grad()), {0.0, 0.0}));
    x.set_grad({});
    gw::pow(x, x).sum().backward();
    CHECK(near(vec(x.grad()), {std::pow(0.5, 0.5) * (std::log(0.5) + 1),
                               std::pow(2.0, 2.0) * (std::log(2.0) + 1)}));
  }
  SECTION("matmul of a matrix with itself") {
    Tensor a = leaf({1.0, 2.0, 3.0, 4.0}, {2, 2});
    gw::matmul(a, a).sum().backward();
    // d sum(A A) / dA = 1 A^T + A^T 1 : [[1+3+1+2, 1+3+3+4], [2+4+1+2, 2+4+3+4]]
    CHECK(vec(a.grad()) == std::vector<double>{7.0, 11.0, 9.0, 13.0});
  }
}

TEST_CASE("gradients of two leaves never alias each other or the caller's gradient",
          "[autograd][engine]") {
  Tensor a = leaf({1.0, 2.0}), b = leaf({3.0, 4.0});
  ((a + b) * 2.0).sum().backward();  // add hands one gradient tensor to both leaves
  REQUIRE(a.grad().defined());
  REQUIRE(b.grad().defined());
  {
    ag::NoGradGuard no_grad;
    Tensor ga = a.grad();
    ga.mul_(10.0);
  }
  CHECK(vec(a.grad()) == std::vector<double>{20.0, 20.0});
  CHECK(vec(b.grad()) == std::vector<double>{2.0, 2.0});

  Tensor x = leaf({1.0, 1.0});
  Tensor g = constant({5.0, 6.0});
  x.backward(g);  // the root is the leaf itself
  CHECK(vec(x.grad()) == std::vector<double>{5.0, 6.0});
  g.mul_(0.0);
  CHECK(vec(x.grad()) == std::vector<double>{5.0, 6.0});
  Tensor z = leaf({1.0, 1.0});
  Tensor g2 = constant({7.0, 8.0});
  (z + 0.0).backward(g2);  // add passes the root gradient straight through
  g2.mul_(0.0);
  CHECK(vec(z.grad()) == std::vector<double>{7.0, 8.0});
}

// --- hooks ------------------------------------------------------------------------------------

TEST_CASE("leaf hooks run in registration order before accumulation", "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  std::vector<int> order;
  std::vector<double> second_saw;
  std::vector<bool> grad_defined_in_hook;
  std::vector<std::vector<double>> grad_in_hook, grad_after;
  x.register_hook([&](const Tensor& g) {
    order.push_back(1);
    return g * 2.0;
  });
  x.register_hook([&](const Tensor& g) {
    order.push_back(2);
    second_saw = vec(g);
    Tensor current = x.grad();
    grad_defined_in_hook.push_back(current.defined());
    grad_in_hook.push_back(current.defined() ? vec(current) : std::vector<double>{});
    return Tensor();  // undefined: keep the gradient
  });
  x.register_hook([&](const Tensor& g) {
    order.push_back(3);
    return g + 1.0;
  });
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor& p) {
    order.push_back(4);
    grad_after.push_back(vec(p.grad()));
  });

  (x * 3.0).sum().backward();
  CHECK(order == std::vector<int>{1, 2, 3, 4});
  CHECK(second_saw == std::vector<double>{6.0, 6.0});  // after the first hook, unchanged by 2
  CHECK(vec(x.grad()) == std::vector<double>{7.0, 7.0});
  order.clear();
  (x * 3.0).sum().backward();
  CHECK(order == std::vector<int>{1, 2, 3, 4});
  REQUIRE(grad_defined_in_hook.size() == 2);
  CHECK_FALSE(grad_defined_in_hook[0]);            // nothing accumulated yet
  CHECK(grad_defined_in_hook[1]);
  CHECK(grad_in_hook[1] == std::vector<double>{7.0, 7.0});  // the old value: not yet updated
  REQUIRE(grad_after.size() == 2);
  CHECK(grad_after[0] == std::vector<double>{7.0, 7.0});
  CHECK(grad_after[1] == std::vector<double>{14.0, 14.0});
  CHECK(vec(x.grad()) == std::vector<double>{14.0, 14.0});
}

TEST_CASE("hooks registered after the forward pass still run", "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 2.0;
  Tensor y = (h * 3.0).sum();  // the graph, x's AccumulateGrad included, exists already
  int leaf_calls = 0, post_calls = 0;
  x.register_hook([&](const Tensor& g) {
    ++leaf_calls;
    return g * -1.0;
  });
  h.register_hook([](const Tensor& g) { return g + 1.0; });
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_calls; });
  y.backward();
  CHECK(leaf_calls == 1);
  CHECK(post_calls == 1);
  CHECK(vec(x.grad()) == std::vector<double>{-8.0, -8.0});  // -(2 * (3 + 1))
}

TEST_CASE("hooks of an intermediate run in order before its gradient flows on",
          "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 3.0;
  std::vector<int> order;
  std::vector<double> seen;
  bool x_grad_defined_in_hook = true;
  h.register_hook([&](const Tensor& g) {
    order.push_back(1);
    x_grad_defined_in_hook = x.grad().defined();
    return g + 1.0;
  });
  h.register_hook([&](const Tensor& g) {
    order.push_back(2);
    seen = vec(g);
    return Tensor();
  });
  h.register_hook([&](const Tensor& g) {
    order.push_back(3);
    return g * 10.0;
  });
  (h * h).sum().backward();  // dy/dh = 2h = [6, 12]
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK_FALSE(x_grad_defined_in_hook);
  CHECK(seen == std::vector<double>{7.0, 13.0});
  CHECK(vec(x.grad()) == std::vector<double>{210.0, 390.0});  // 3 * 10 * [7, 13]
}

TEST_CASE("retain_grad on several intermediates", "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor a = x * 2.0;
  Tensor b = a * a;
  Tensor c = b + a;
  Tensor y = (c * 3.0).sum();
  for (const Tensor* t : {&a, &b, &c, &y}) t->retain_grad();
  x.retain_grad();  // a no-op on a leaf
  y.backward({}, true);
  // dy/dc = dy/db = 3; dy/da = 3 (2a + 1); dy/dx = 2 dy/da
  CHECK(vec(y.grad()) == std::vector<double>{1.0});
  CHECK(vec(c.grad()) == std::vector<double>{3.0, 3.0});
  CHECK(vec(b.grad()) == std::vector<double>{3.0, 3.0});
  CHECK(vec(a.grad()) == std::vector<double>{15.0, 27.0});
  CHECK(vec(x.grad()) == std::vector<double>{30.0, 54.0});
  // A second pass accumulates into the retained gradients as into leaves.
  y.backward();
  CHECK(vec(a.grad()) == std::vector<double>{30.0, 54.0});
  CHECK(vec(c.grad()) == std::vector<double>{6.0, 6.0});
  CHECK(vec(x.grad()) == std::vector<double>{60.0, 108.0});
  // Intermediates that did not ask keep no gradient.
  Tensor d = x * 5.0;
  (d * 1.0).sum().backward();
  CHECK_FALSE(d.grad().defined());
}

TEST_CASE("a retained gradient is a copy, not the tensor flowing on", "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 1.0;
  h.retain_grad();
  h.register_hook([](const Tensor& g) { return g * 2.0; });  // replaces, never mutates
  (h * 4.0).sum().backward();
  CHECK(vec(x.grad()) == std::vector<double>{8.0, 8.0});
  {
    ag::NoGradGuard no_grad;
    Tensor hg = h.grad();
    REQUIRE(hg.defined());
    hg.add_(100.0);
  }
  CHECK(vec(x.grad()) == std::vector<double>{8.0, 8.0});
}

// --- post-accumulate hooks (DDP) ----------------------------------------------------------------

TEST_CASE("post-accumulate hooks fire once per backward, after .grad, in reverse order of use",
          "[autograd][hooks][ddp]") {
  // An MLP-like chain of three linear layers; parameters created (and used) in order.
  const std::vector<std::string> names = {"W1", "b1", "W2", "b2", "W3", "b3"};
  std::vector<Tensor> params = {
      leaf({0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, {3, 2}), leaf({0.01, 0.02, 0.03}),
      leaf({0.2, -0.1, 0.05, 0.3, 0.1, -0.2}, {2, 3}), leaf({-0.01, 0.02}),
      leaf({0.5, -0.4}, {1, 2}),                      leaf({0.1}),
  };
  std::vector<std::string> ready;
  std::map<std::string, std::vector<std::vector<double>>> seen;  // .grad inside the hook
  for (size_t i = 0; i < params.size(); ++i) {
    ag::register_post_accumulate_grad_hook(params[i], [&, i](const Tensor& p) {
      ready.push_back(names[i]);
      REQUIRE(p.grad().defined());
      seen[names[i]].push_back(vec(p.grad()));
    });
  }
  Tensor x = gw::from_vector<double>({1.0, -2.0, 0.5, 3.0}, {2, 2});
  auto step = [&] {
    Tensor h = gw::tanh(gw::linear(x, params[0], params[1]));
    h = gw::tanh(gw::linear(h, params[2], params[3]));
    gw::linear(h, params[4], params[5]).sum().backward();
  };
  step();
  const std::vector<std::string> reverse = {"b3", "W3", "b2", "W2", "b1", "W1"};
  CHECK(ready == reverse);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(names[i]);
    REQUIRE(seen[names[i]].size() == 1);
    CHECK(seen[names[i]][0] == vec(params[i].grad()));  // the hook saw the updated .grad
  }
  // b3's gradient is the number of rows, whatever the weights.
  CHECK(vec(params[5].grad()) == std::vector<double>{2.0});

  ready.clear();
  std::vector<std::vector<double>> first;
  for (const Tensor& p : params) first.push_back(vec(p.grad()));
  step();  // a second iteration with a fresh graph: same order, accumulated values
  CHECK(ready == reverse);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(names[i]);
    REQUIRE(seen[names[i]].size() == 2);
    std::vector<double> doubled = first[i];
    for (double& v : doubled) v *= 2;
    CHECK(near(seen[names[i]][1], doubled));
  }
}

TEST_CASE("post-accumulate readiness follows reverse use, not creation", "[autograd][hooks][ddp]") {
  Tensor p0 = leaf({2.0}), p1 = leaf({3.0}), p2 = leaf({5.0});  // created 0, 1, 2
  std::vector<int> ready;
  ag::register_post_accumulate_grad_hook(p0, [&](const Tensor&) { ready.push_back(0); });
  ag::register_post_accumulate_grad_hook(p1, [&](const Tensor&) { ready.push_back(1); });
  ag::register_post_accumulate_grad_hook(p2, [&](const Tensor&) { ready.push_back(2); });
  Tensor x = constant({7.0});
  Tensor y = ((x * p2) * p0) * p1;  // used 2, 0, 1
  y.sum().backward();
  CHECK(ready == std::vector<int>{1, 0, 2});
  CHECK(vec(p0.grad()) == std::vector<double>{7.0 * 5.0 * 3.0});
  CHECK(vec(p1.grad()) == std::vector<double>{7.0 * 5.0 * 2.0});
  CHECK(vec(p2.grad()) == std::vector<double>{7.0 * 2.0 * 3.0});
  // A leaf the graph does not reach fires nothing.
  ready.clear();
  (x * p1).sum().backward();
  CHECK(ready == std::vector<int>{1});
}

// --- threads ------------------------------------------------------------------------------------

TEST_CASE("concurrent backward over independent graphs on two threads",
          "[autograd][engine][threads]") {
  // y = sum(tanh(W v)): dW[i][j] = (1 - tanh(s_i)^2) v_j with s = W v, computed in plain C++.
  const std::vector<std::vector<double>> w_values = {
      {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 0.05, -0.15, 0.25},
      {-0.3, 0.2, 0.1, 0.6, 0.5, -0.4, 0.2, 0.8, -0.9, 0.35, 0.45, -0.05}};
  const std::vector<std::vector<double>> v_values = {{1.0, -2.0, 0.5, 1.5}, {0.3, 0.7, -1.1, 2.0}};
  std::vector<std::vector<double>> expected(2);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 3; ++i) {
      double s = 0;
      for (int j = 0; j < 4; ++j) s += w_values[t][i * 4 + j] * v_values[t][j];
      double d = 1 - std::tanh(s) * std::tanh(s);
      for (int j = 0; j < 4; ++j) expected[t].push_back(d * v_values[t][j]);
    }
  }
  constexpr int kIterations = 200;
  std::vector<int> mismatches(2, 0), errors(2, 0);
  std::latch start(2);
  auto worker = [&](int t) {
    start.arrive_and_wait();
    for (int it = 0; it < kIterations; ++it) {
      try {
        Tensor w = leaf(w_values[t], {3, 4});
        Tensor v = constant(v_values[t]);
        gw::tanh(gw::matmul(w, v)).sum().backward();
        if (!near(vec(w.grad()), expected[t], 1e-10)) ++mismatches[t];
      } catch (...) {
        ++errors[t];
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  CHECK(mismatches == std::vector<int>{0, 0});
  CHECK(errors == std::vector<int>{0, 0});
}

TEST_CASE("two threads backward through graphs sharing one leaf", "[autograd][engine][threads]") {
  SECTION("one long-lived leaf: the total .grad is the sum of every pass") {
    Tensor x = leaf({1.0, 2.0, 3.0});
    constexpr int kIterations = 300;
    std::atomic<int> errors{0};
    std::atomic<int> fired{0};
    ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { fired.fetch_add(1); });
    std::latch start(2);
    auto worker = [&](std::vector<double> c) {
      Tensor ct = constant(c);
      start.arrive_and_wait();
      for (int it = 0; it < kIterations; ++it) {
        try {
          (x * ct).sum().backward();  // adds c to x.grad (integers: exact in any order)
        } catch (...) {
          errors.fetch_add(1);
        }
      }
    };
    std::thread a(worker, std::vector<double>{1.0, 2.0, 3.0});
    std::thread b(worker, std::vector<double>{10.0, 20.0, 30.0});
    a.join();
    b.join();
    CHECK(errors.load() == 0);
    CHECK(fired.load() == 2 * kIterations);
    CHECK(vec(x.grad()) == std::vector<double>{11.0 * kIterations, 22.0 * kIterations,
                                               33.0 * kIterations});
  }
  SECTION("a fresh leaf per round, both threads starting on it together") {
    constexpr int kRounds = 300;
    std::vector<Tensor> leaves;
    for (int r = 0; r < kRounds; ++r) leaves.push_back(leaf({0.5, -1.0}));
    std::atomic<int> errors{0};
    std::barrier sync(2);
    auto worker = [&](double scale) {
      for (int r = 0; r < kRounds; ++r) {
        sync.arrive_and_wait();
        try {
          const Tensor& x = leaves[r];
          ((x * x) * scale + x).sum().backward();  // 2 scale x + 1
        } catch (...) {
          errors.fetch_add(1);
        }
      }
    };
    std::thread a(worker, 1.0), b(worker, 3.0);
    a.join();
    b.join();
    CHECK(errors.load() == 0);
    int wrong = 0;
    for (const Tensor& x : leaves) {
      // (2*1*x + 1) + (2*3*x + 1) = 8x + 2
      if (!x.grad().defined() || vec(x.grad()) != std::vector<double>{6.0, -6.0}) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

// --- autograd::grad -----------------------------------------------------------------------------

TEST_CASE("grad with several outputs and inputs", "[autograd][grad]") {
  Tensor x = leaf({1.0, 2.0}), w = leaf({3.0, 4.0});
  int fired = 0;
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++fired; });
  SECTION("scalar outputs sum their gradients") {
    Tensor y1 = (x * w).sum(), y2 = (x * x).sum();
    std::vector<Tensor> g = ag::grad({y1, y2}, {x, w});
    REQUIRE(g.size() == 2);
    CHECK(vec(g[0]) == std::vector<double>{3.0 + 2.0, 4.0 + 4.0});
    CHECK(vec(g[1]) == std::vector<double>{1.0, 2.0});
  }
  SECTION("grad_outputs weight each output") {
    Tensor y1 = x * w, y2 = x + w;
    ag::GradOptions o;
    o.grad_outputs = {constant({1.0, 10.0}), constant({100.0, 1000.0})};
    std::vector<Tensor> g = ag::grad({y1, y2}, {w, x}, o);
    CHECK(vec(g[0]) == std::vector<double>{1.0 + 100.0, 20.0 + 1000.0});
    CHECK(vec(g[1]) == std::vector<double>{3.0 + 100.0, 40.0 + 1000.0});
  }
  SECTION("an intermediate can be an input") {
    Tensor h = x * w;
    Tensor y = (h * h).sum();
    std::vector<Tensor> g = ag::grad({y}, {h, x});
    CHECK(vec(g[0]) == std::vector<double>{6.0, 16.0});        // 2h
    CHECK(vec(g[1]) == std::vector<double>{18.0, 64.0});       // 2h w
  }
  SECTION("an output can be its own input") {
    Tensor h = x * w;
    ag::GradOptions o;
    o.grad_outputs = {constant({2.0, 5.0})};
    std::vector<Tensor> g = ag::grad({h}, {h, x}, o);
    CHECK(vec(g[0]) == std::vector<double>{2.0, 5.0});
    CHECK(vec(g[1]) == std::vector<double>{6.0, 20.0});
  }
  SECTION("allow_unused") {
    Tensor z = leaf({5.0});
    Tensor y = (x * 2.0).sum();
    CHECK_THROWS_WITH(ag::grad({y}, {x, z}, {{}, true, false}), Catch::Contains("not used"));
    ag::GradOptions o;
    o.allow_unused = true;
    std::vector<Tensor> g = ag::grad({(x * 2.0).sum()}, {x, z}, o);
    CHECK(vec(g[0]) == std::vector<double>{2.0, 2.0});
    CHECK_FALSE(g[1].defined());
  }
  SECTION("retain_graph lets grad run twice") {
    Tensor y = (gw::exp(x) * w).sum();
    ag::GradOptions keep;
    keep.retain_graph = true;
    std::vector<Tensor> g1 = ag::grad({y}, {x}, keep);
    std::vector<Tensor> g2 = ag::grad({y}, {x});
    CHECK(near(vec(g1[0]), {3.0 * std::exp(1.0), 4.0 * std::exp(2.0)}));
    CHECK(vec(g1[0]) == vec(g2[0]));
    CHECK_THROWS_WITH(ag::grad({y}, {x}), Catch::Contains("second time"));
  }
  SECTION("bad grad_outputs are rejected") {
    Tensor y = x * w;
    ag::GradOptions wrong_count;
    wrong_count.grad_outputs = {constant({1.0, 1.0}), constant({1.0, 1.0})};
    CHECK_THROWS_AS(ag::grad({y}, {x}, wrong_count), gw::InvalidArgumentError);
    ag::GradOptions wrong_shape;
    wrong_shape.grad_outputs = {constant({1.0, 1.0, 1.0})};
    CHECK_THROWS_AS(ag::grad({y}, {x}, wrong_shape), gw::ShapeError);
    CHECK_THROWS_WITH(ag::grad({y}, {x}), Catch::Contains("only for scalar outputs"));
  }
  // grad never touches .grad nor fires post-accumulate hooks.
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  CHECK(fired == 0);
}

// --- errors -------------------------------------------------------------------------------------

TEST_CASE("backward through a freed graph is an error", "[autograd][errors]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = gw::exp(x).sum();
  y.backward();
  CHECK_THROWS_AS(y.backward(), gw::StateError);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("second time") && Catch::Contains("retain"));
  // The first pass's gradient is intact.
  CHECK(near(vec(x.grad()), {std::exp(1.0), std::exp(2.0)}));
  // Part of a graph freed by one backward cannot be reused by a later one either.
  Tensor h = x * x;
  (h * 2.0).sum().backward();
  CHECK_THROWS_WITH((h * 3.0).sum().backward(), Catch::Contains("second time"));
}

TEST_CASE("a saved tensor modified in place is detected through the version counter",
          "[autograd][errors]") {
  SECTION("the leaf saved by mul") {
    Tensor x = leaf({1.0, 2.0});
    Tensor y = (x * x).sum();
    {
      ag::NoGradGuard no_grad;
      x.mul_(2.0);
    }
    CHECK_THROWS_AS(y.backward(), gw::StateError);
  }
  SECTION("an output saved by exp, modified through a view") {
    Tensor x = leaf({1.0, 2.0});
    Tensor e = gw::exp(x);
    Tensor y = (e * 1.0).sum();  // mul saves e
    {
      ag::NoGradGuard no_grad;
      Tensor view = e.view({2, 1});
      view.add_(1.0);  // shares e's storage and version
    }
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("in-place"));
  }
  SECTION("a tensor no rule saved may change") {
    Tensor x = leaf({1.0, 2.0});
    Tensor a = x * 2.0;
    Tensor y = (a + 1.0).sum();  // add saves nothing
    {
      ag::NoGradGuard no_grad;
      a.add_(5.0);
    }
    CHECK_NOTHROW(y.backward());
    CHECK(vec(x.grad()) == std::vector<double>{2.0, 2.0});
  }
}

TEST_CASE("roots and inputs that cannot be differentiated are rejected", "[autograd][errors]") {
  Tensor x = leaf({1.0, 2.0});
  SECTION("non-scalar root without a gradient") {
    CHECK_THROWS_AS((x * 2.0).backward(), gw::InvalidArgumentError);
    CHECK_THROWS_AS((x * 2.0).backward(constant({1.0, 2.0, 3.0})), gw::ShapeError);
    CHECK_THROWS_AS(ag::backward({(x * 2.0).sum()}, {Tensor(), Tensor()}),
                    gw::InvalidArgumentError);
  }
  SECTION("a tensor that does not require grad") {
    Tensor c = constant({1.0, 2.0});
    CHECK_THROWS_WITH(c.sum().backward(), Catch::Contains("does not require grad"));
    CHECK_THROWS_WITH(ag::grad({(x * c).sum()}, {c}), Catch::Contains("does not require grad"));
    CHECK_THROWS_AS(c.register_hook([](const Tensor& g) { return g; }), gw::InvalidArgumentError);
    CHECK_THROWS_AS(c.retain_grad(), gw::InvalidArgumentError);
    CHECK_THROWS_AS(ag::register_post_accumulate_grad_hook(x * 2.0, [](const Tensor&) {}),
                    gw::InvalidArgumentError);
  }
  SECTION("requires_grad_ on integer and bool tensors") {
    Tensor i = gw::from_vector<int64_t>({1, 2});
    CHECK_THROWS_AS(i.requires_grad_(), gw::DTypeError);
    CHECK_FALSE(i.requires_grad());
    Tensor i32 = gw::from_vector<int32_t>({1, 2});
    CHECK_THROWS_AS(i32.requires_grad_(true), gw::DTypeError);
    Tensor b = gw::from_vector<bool>({true});
    CHECK_THROWS_AS(b.requires_grad_(), gw::DTypeError);
    CHECK_NOTHROW(i.requires_grad_(false));
    // Integer results of differentiable inputs record nothing.
    Tensor idx = gw::argmax(x);
    CHECK_FALSE(idx.requires_grad());
    CHECK_FALSE(gw::gt(x, 1.0).requires_grad());
  }
}

// --- grad mode --------------------------------------------------------------------------------

TEST_CASE("NoGradGuard and EnableGradGuard nest and restore", "[autograd][grad_mode]") {
  Tensor x = leaf({1.0});
  REQUIRE(ag::is_grad_enabled());
  {
    ag::NoGradGuard outer;
    CHECK_FALSE(ag::is_grad_enabled());
    CHECK_FALSE((x * 2.0).requires_grad());
    {
      ag::EnableGradGuard inner;
      CHECK(ag::is_grad_enabled());
      Tensor y = x * 2.0;
      CHECK(y.requires_grad());
      CHECK(y.grad_fn() != nullptr);
      {
        ag::NoGradGuard innermost;
        CHECK_FALSE((x * 2.0).requires_grad());
      }
      CHECK((x * 2.0).requires_grad());
      // backward works whatever the mode: it records nothing itself
      y.sum().backward();
    }
    CHECK_FALSE(ag::is_grad_enabled());
    CHECK_FALSE((x * 2.0).requires_grad());
  }
  CHECK(ag::is_grad_enabled());
  CHECK(vec(x.grad()) == std::vector<double>{2.0});

  // Guards restore the mode when an exception unwinds through them.
  try {
    ag::NoGradGuard no_grad;
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error&) {
  }
  CHECK(ag::is_grad_enabled());
}

TEST_CASE("backward runs under NoGradGuard and records nothing", "[autograd][grad_mode]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = (x * x).sum();
  ag::NoGradGuard no_grad;
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{2.0, 4.0});
  CHECK_FALSE(x.grad().requires_grad());
}

TEST_CASE("grad mode is per thread", "[autograd][grad_mode][threads]") {
  Tensor x = leaf({1.0});
  ag::NoGradGuard no_grad;
  bool other_enabled = false, other_records = false;
  std::thread t([&] {
    other_enabled = ag::is_grad_enabled();
    other_records = (x * 2.0).requires_grad();
  });
  t.join();
  CHECK(other_enabled);
  CHECK(other_records);
  CHECK_FALSE((x * 2.0).requires_grad());
}

// --- the GraphTask API (distributed autograd's view of the engine) ------------------------------

TEST_CASE("a GraphTask with an extra root fed later from another thread",
          "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0, 3.0}), w = leaf({2.0, -1.0, 0.5});
  Tensor sent = x * w;                    // as if sent to another worker
  Tensor local = (x * 3.0).sum();         // this worker's own loss
  auto send = std::make_shared<FakeSendBackward>(sent);
  auto root = std::make_shared<TestRoot>(std::vector<ag::Edge>{ag::gradient_edge(local)},
                                         std::vector<Tensor>{gw::ones({}, gw::kFloat64)});
  ag::ExecuteOptions options;
  options.extra_roots = {send};
  ag::GraphTask task(root, options);

  task.run();  // the local part runs; x's accumulation waits for the send's gradient
  CHECK_FALSE(task.finished());
  CHECK(send->calls == 0);
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());

  Tensor remote = constant({10.0, 20.0, 30.0});
  std::thread network([&] { task.add_gradient(send, 0, remote); });
  network.join();
  task.run();
  CHECK(task.finished());
  CHECK(send->calls == 1);
  CHECK(vec(send->received) == std::vector<double>{10.0, 20.0, 30.0});
  // dx = 3 + w * remote; dw = x * remote
  CHECK(vec(x.grad()) == std::vector<double>{23.0, -17.0, 18.0});
  CHECK(vec(w.grad()) == std::vector<double>{10.0, 40.0, 90.0});
}

TEST_CASE("a GraphTask made only of extra roots, fed by two threads at once",
          "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor s1 = x * 2.0, s2 = x * x;
  auto send1 = std::make_shared<FakeSendBackward>(s1);
  auto send2 = std::make_shared<FakeSendBackward>(s2);
  ag::ExecuteOptions options;
  options.extra_roots = {send1, send2};
  ag::GraphTask task(nullptr, options);
  CHECK_FALSE(task.finished());
  std::latch start(2);
  std::thread a([&] {
    start.arrive_and_wait();
    task.add_gradient(send1, 0, constant({1.0, 1.0}));
  });
  std::thread b([&] {
    start.arrive_and_wait();
    task.add_gradient(send2, 0, constant({5.0, 7.0}));
  });
  a.join();
  b.join();
  task.run();
  CHECK(task.finished());
  CHECK(send1->calls == 1);
  CHECK(send2->calls == 1);
  // 2 * 1 + 2x * g2
  CHECK(vec(x.grad()) == std::vector<double>{2.0 + 10.0, 2.0 + 28.0});
}

TEST_CASE("a leaf sink collects leaf gradients instead of .grad", "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0}), w = leaf({3.0, 4.0});
  int post_fired = 0, hook_calls = 0;
  bool sink_visible_in_hook = false;
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_fired; });
  ag::register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++post_fired; });
  x.register_hook([&](const Tensor& g) {
    ++hook_calls;
    sink_visible_in_hook = ag::current_leaf_sink() != nullptr;
    return g;
  });
  gw::TensorMap<Tensor> collected;
  std::map<std::string, int> calls;
  std::mutex mu;
  ag::ExecuteOptions options;
  options.leaf_sink = [&](const Tensor& leaf_tensor, const Tensor& g) {
    std::lock_guard lock(mu);
    calls[leaf_tensor.same(x) ? "x" : leaf_tensor.same(w) ? "w" : "?"] += 1;
    auto it = collected.find(leaf_tensor);
    if (it == collected.end()) {
      collected.emplace(leaf_tensor, g.clone());
    } else {
      it->second = it->second + g;
    }
  };
  // x is used in two branches: the sink still sees one, summed gradient.
  Tensor y = (x * w).sum() + (x * 5.0).sum();
  ag::run_backward({ag::gradient_edge(y)}, {gw::ones({}, gw::kFloat64)}, options);

  CHECK(calls == std::map<std::string, int>{{"x", 1}, {"w", 1}});
  REQUIRE(collected.count(x) == 1);
  REQUIRE(collected.count(w) == 1);
  CHECK(vec(collected.at(x)) == std::vector<double>{8.0, 9.0});
  CHECK(vec(collected.at(w)) == std::vector<double>{1.0, 2.0});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  CHECK(post_fired == 0);
  CHECK(hook_calls == 1);  // the leaf's own tensor hook still runs
  CHECK(sink_visible_in_hook);
  CHECK(ag::current_leaf_sink() == nullptr);  // the sink belonged to that task only

  // An ordinary backward afterwards accumulates into .grad and fires the hooks again.
  (x * w).sum().backward();
  CHECK(vec(x.grad()) == std::vector<double>{3.0, 4.0});
  CHECK(post_fired == 2);
}

TEST_CASE("a GraphTask with a leaf sink and an extra root", "[autograd][engine][graph_task]") {
  // Distributed backward in one picture: local loss + a send whose gradient arrives later,
  // leaf gradients going to the context's map.
  Tensor x = leaf({1.0, -1.0});
  Tensor sent = gw::tanh(x);
  Tensor local = (x * x).sum();
  auto send = std::make_shared<FakeSendBackward>(sent);
  auto root = std::make_shared<TestRoot>(std::vector<ag::Edge>{ag::gradient_edge(local)},
                                         std::vector<Tensor>{gw::ones({}, gw::kFloat64)});
  gw::TensorMap<Tensor> context;
  ag::ExecuteOptions options;
  options.extra_roots = {send};
  options.leaf_sink = [&](const Tensor& l, const Tensor& g) { context[l] = g.clone(); };
  ag::GraphTask task(root, options);
  task.run();
  CHECK(context.empty());
  std::thread network([&] { task.add_gradient(send, 0, constant({2.0, 4.0})); });
  network.join();
  task.run();
  CHECK(task.finished());
  REQUIRE(context.count(x) == 1);
  // 2x + (1 - tanh^2 x) g
  double d = 1 - std::tanh(1.0) * std::tanh(1.0);
  CHECK(near(vec(context.at(x)), {2.0 + 2.0 * d, -2.0 + 4.0 * d}));
  CHECK_FALSE(x.grad().defined());
}
