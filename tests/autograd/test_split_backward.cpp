// backward_input and WeightGradients: the backward pass in two parts (zero-bubble pipelines).
#include <catch2/catch.hpp>

#include <utility>

#include "autograd/activation_checkpoint.h"
#include "autograd/autograd.h"
#include "tests/autograd/engine_test_util.h"

using engine_test::near;
using engine_test::vec;
using gw::Tensor;
namespace ag = gw::autograd;

namespace {

// y = x * w elementwise, whose node records which gradients each pass asked it for.
class SplitProbe final : public ag::Node {
 public:
  SplitProbe(const Tensor& x, const Tensor& w) : x_(x), w_(w) {}
  ag::TensorList apply(ag::TensorList&& grads) override {
    const bool dx = ag::wants(*this, 0), dw = ag::wants(*this, 1);
    asked.emplace_back(dx, dw);
    return {dx ? grads[0] * w_ : Tensor(), dw ? grads[0] * x_ : Tensor()};
  }
  std::string name() const override { return "SplitProbe"; }
  std::vector<std::pair<bool, bool>> asked;

 private:
  Tensor x_, w_;
};

Tensor probe_mul(const Tensor& x, const Tensor& w, std::shared_ptr<SplitProbe>* node) {
  Tensor y;
  {
    ag::NoGradGuard no_grad;
    y = x * w;
  }
  *node = std::make_shared<SplitProbe>(x.detach(), w.detach());
  (*node)->next_edges = ag::collect_edges({&x, &w});
  ag::set_history(y, *node);
  return y;
}

// A small network in float64 whose input x reaches the loss through two weights, and whose
// weights also reach it by paths that avoid x (a bias, a penalty, a weight used twice).
struct SplitNet {
  gw::Generator gen{7};
  Tensor w1 = gw::randn({5, 6}, gen, gw::kFloat64).requires_grad_();
  Tensor b1 = gw::randn({6}, gen, gw::kFloat64).requires_grad_();
  Tensor w2 = gw::randn({6, 3}, gen, gw::kFloat64).requires_grad_();
  Tensor pos = gw::randn({4, 3}, gen, gw::kFloat64).requires_grad_();

  Tensor forward(const Tensor& x) const {
    Tensor h = gw::gelu(gw::matmul(x, w1) + b1);
    Tensor y = gw::matmul(h, w2) + pos;
    return (y * y).sum() + (w1 * w1).sum() * 0.1;
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, pos}; }
  void zero() const {
    for (const Tensor& p : params()) p.set_grad({});
  }
};

}  // namespace

TEST_CASE("backward_input then the rest equals one backward, to 1e-12",
          "[autograd][split_backward]") {
  SplitNet net;
  gw::Generator gen(3);
  Tensor x0 = gw::randn({4, 5}, gen, gw::kFloat64);

  Tensor x = x0.clone().requires_grad_();
  net.forward(x).backward();
  std::vector<std::vector<double>> expected;
  for (const Tensor& p : net.params()) expected.push_back(vec(p.grad()));
  const std::vector<double> expected_dx = vec(x.grad());
  net.zero();

  Tensor x2 = x0.clone().requires_grad_();
  ag::WeightGradients rest;
  std::vector<Tensor> dx = ag::backward_input({net.forward(x2)}, {x2}, {}, rest);
  REQUIRE(dx.size() == 1);
  CHECK(near(vec(dx[0]), expected_dx));
  CHECK_FALSE(x2.grad().defined());  // returned, not accumulated
  for (const Tensor& p : net.params()) CHECK_FALSE(p.grad().defined());
  REQUIRE_FALSE(rest.empty());

  rest.run();
  CHECK(rest.empty());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << i);
    CHECK(near(vec(net.params()[i].grad()), expected[i]));
  }
  CHECK_FALSE(x2.grad().defined());  // the rest does not reach the input again
  rest.run();                        // empty: nothing more
  CHECK(near(vec(net.w2.grad()), expected[2]));
}

TEST_CASE("backward_input asks a node only for its input's gradient; the rest for the weight's",
          "[autograd][split_backward]") {
  Tensor x = engine_test::leaf({1.0, 2.0}), w = engine_test::leaf({3.0, 4.0});
  std::shared_ptr<SplitProbe> node;
  Tensor loss = (probe_mul(x, w, &node) * 2.0).sum();
  ag::WeightGradients rest;
  Tensor dx = ag::backward_input({loss}, {x}, {}, rest)[0];
  CHECK(vec(dx) == std::vector<double>{6.0, 8.0});
  REQUIRE(node->asked.size() == 1);
  CHECK(node->asked[0] == std::pair{true, false});
  rest.run();
  REQUIRE(node->asked.size() == 2);
  CHECK(node->asked[1] == std::pair{false, true});
  CHECK(vec(w.grad()) == std::vector<double>{2.0, 4.0});
  CHECK_FALSE(x.grad().defined());

  SECTION("autograd::grad asks only for what it captures too") {
    Tensor x3 = engine_test::leaf({1.0}), w3 = engine_test::leaf({5.0});
    std::shared_ptr<SplitProbe> n3;
    Tensor y3 = probe_mul(x3, w3, &n3).sum();
    CHECK(vec(ag::grad({y3}, {w3})[0]) == std::vector<double>{1.0});
    REQUIRE(n3->asked.size() == 1);
    CHECK(n3->asked[0] == std::pair{false, true});
  }
}

TEST_CASE("backward_input: no inputs, unused inputs, and a rest not yet run",
          "[autograd][split_backward]") {
  SplitNet net;
  gw::Generator gen(5);
  Tensor x0 = gw::randn({4, 5}, gen, gw::kFloat64);
  net.forward(x0).backward();
  const std::vector<double> expected_w1 = vec(net.w1.grad());
  net.zero();

  SECTION("no inputs: all of the backward is the rest") {
    ag::WeightGradients rest;
    CHECK(ag::backward_input({net.forward(x0)}, {}, {}, rest).empty());
    CHECK_FALSE(net.w1.grad().defined());
    rest.run();
    CHECK(near(vec(net.w1.grad()), expected_w1));
  }
  SECTION("an input the outputs do not use gets an undefined gradient") {
    Tensor unused = engine_test::leaf({1.0});
    ag::WeightGradients rest;
    auto got = ag::backward_input({net.forward(x0)}, {unused}, {}, rest);
    CHECK_FALSE(got[0].defined());
    rest.run();
    CHECK(near(vec(net.w1.grad()), expected_w1));
  }
  SECTION("a rest not yet run is refused, and bad arguments named") {
    Tensor x = x0.clone().requires_grad_();
    ag::WeightGradients rest;
    ag::backward_input({net.forward(x)}, {x}, {}, rest);
    Tensor x2 = x0.clone().requires_grad_();
    CHECK_THROWS_WITH(ag::backward_input({net.forward(x2)}, {x2}, {}, rest),
                      Catch::Contains("backward_input") && Catch::Contains("run it"));
    ag::WeightGradients other;
    CHECK_THROWS_WITH(ag::backward_input({net.forward(x2)}, {x0}, {}, other),
                      Catch::Contains("input 0 does not require grad"));
    CHECK_THROWS_WITH(ag::backward_input({net.forward(x2)}, {x2}, {Tensor(), Tensor()}, other),
                      Catch::Contains("2 grad_outputs for 1 outputs"));
  }
}

TEST_CASE("backward_input frees what only the input's gradient needed",
          "[autograd][split_backward]") {
  // x -> gelu -> matmul with w: gelu's saved input serves only x's gradient, so it goes with the
  // input part; the product keeps its saved tensors until the rest ran (w's gradient needs h).
  gw::Generator gen(9);
  Tensor x = gw::randn({2, 3}, gen, gw::kFloat64).requires_grad_();
  Tensor w = gw::randn({3, 2}, gen, gw::kFloat64).requires_grad_();
  Tensor h = gw::gelu(x);
  Tensor y = gw::matmul(h, w);
  std::shared_ptr<ag::Node> gelu_node = h.grad_fn(), product_node = y.grad_fn();
  ag::WeightGradients rest;
  ag::backward_input({y.sum()}, {x}, {}, rest);
  auto apply_again = [](const std::shared_ptr<ag::Node>& n, const Tensor& g) { n->apply({g}); };
  CHECK_THROWS_WITH(apply_again(gelu_node, gw::ones({2, 3}, gw::kFloat64)),
                    Catch::Contains("second time"));
  CHECK_NOTHROW(apply_again(product_node, gw::ones({2, 2}, gw::kFloat64)));
  rest.run();
  CHECK_THROWS_WITH(apply_again(product_node, gw::ones({2, 2}, gw::kFloat64)),
                    Catch::Contains("second time"));
  CHECK(w.grad().defined());
}

TEST_CASE("backward_input and the rest run each hook once, in the part that reaches it",
          "[autograd][split_backward]") {
  SplitNet net;
  gw::Generator gen(11);
  Tensor x = gw::randn({4, 5}, gen, gw::kFloat64).requires_grad_();
  int on_hidden = 0, on_w1 = 0, after_w2 = 0;
  Tensor h = gw::matmul(x, net.w1);
  h.register_hook([&](const Tensor&) {
    ++on_hidden;
    return Tensor();
  });
  h.retain_grad();
  net.w1.register_hook([&](const Tensor&) {
    ++on_w1;
    return Tensor();
  });
  auto handle = ag::register_post_accumulate_grad_hook(net.w2, [&](const Tensor&) { ++after_w2; });
  Tensor loss = (gw::matmul(gw::gelu(h + net.b1), net.w2) * 2.0).sum();
  ag::WeightGradients rest;
  ag::backward_input({loss}, {x}, {}, rest);
  CHECK(on_hidden == 1);  // on the way to x: in I
  CHECK(h.grad().defined());
  CHECK(on_w1 == 0);
  CHECK(after_w2 == 0);
  rest.run();
  CHECK(on_hidden == 1);
  CHECK(on_w1 == 1);  // the weights': in the rest
  CHECK(after_w2 == 1);
  handle.remove();
}

TEST_CASE(
    "backward_input: a failing node leaves no rest; a checkpoint and a non-leaf input are "
    "refused",
    "[autograd][split_backward]") {
  SECTION("a hook that throws after a node was left for the rest") {
    Tensor x = engine_test::leaf({1.0, 2.0}), w = engine_test::leaf({3.0, 4.0});
    Tensor h = x * x;
    std::shared_ptr<SplitProbe> node;
    Tensor y = probe_mul(h, w, &node);  // owes w's gradient: left for the rest, then h's hook
    h.register_hook([](const Tensor&) -> Tensor { throw gw::StateError("hook failed"); });
    ag::WeightGradients rest;
    CHECK_THROWS_WITH(ag::backward_input({y.sum()}, {x}, {}, rest), Catch::Contains("hook failed"));
    REQUIRE(node->asked.size() == 1);  // it ran, and was left for the rest
    CHECK(rest.empty());               // but the failed pass leaves none
  }
  SECTION("activation checkpoint") {
    SplitNet net;
    gw::Generator gen(12);
    Tensor x = gw::randn({4, 5}, gen, gw::kFloat64).requires_grad_();
    auto outs = ag::checkpoint(
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{gw::matmul(in[0], net.w1).sum()};
        },
        {x});
    ag::WeightGradients rest;
    CHECK_THROWS_WITH(ag::backward_input({outs[0]}, {x}, {}, rest),
                      Catch::Contains("CheckpointFunctionBackward needs its weights' gradients"));
  }
  SECTION("an input made by an op") {
    Tensor x = engine_test::leaf({1.0, 2.0});
    Tensor h = x * 2.0;
    ag::WeightGradients rest;
    CHECK_THROWS_WITH(ag::backward_input({(h * h).sum()}, {h}, {}, rest),
                      Catch::Contains("input 0 is not a leaf"));
  }
}

TEST_CASE("backward_input runs its input's hooks once and returns what they give",
          "[autograd][split_backward][hooks]") {
  Tensor x = gw::from_vector(std::vector<double>{1.0, 2.0}).requires_grad_();
  Tensor w = gw::from_vector(std::vector<double>{3.0, 4.0}).requires_grad_();
  int calls = 0;
  x.register_hook([&](const Tensor& g) {
    ++calls;
    return g * 10.0;
  });
  ag::WeightGradients rest;
  std::vector<Tensor> dx = ag::backward_input({(x * w).sum()}, {x}, {}, rest);
  CHECK(calls == 1);
  CHECK(vec(dx[0]) == std::vector<double>{30.0, 40.0});  // 10 w
  rest.run();
  CHECK(calls == 1);
  CHECK(vec(w.grad()) == std::vector<double>{1.0, 2.0});
  CHECK_FALSE(x.grad().defined());
}
