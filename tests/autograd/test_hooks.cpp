// Hooks: order of tensor hooks, retain_grad, and post-accumulate hooks (DDP's readiness signal
// and its order).
#include <catch2/catch.hpp>

#include <map>

#include "tests/autograd/engine_test_util.h"

using namespace engine_test;

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
  CHECK_FALSE(grad_defined_in_hook[0]);  // nothing accumulated yet
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
      leaf({0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, {3, 2}),
      leaf({0.01, 0.02, 0.03}),
      leaf({0.2, -0.1, 0.05, 0.3, 0.1, -0.2}, {2, 3}),
      leaf({-0.01, 0.02}),
      leaf({0.5, -0.4}, {1, 2}),
      leaf({0.1}),
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

TEST_CASE("a removed post-accumulate hook no longer runs; the others still do",
          "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  std::vector<int> fired;
  ag::RemovableHandle self;
  ag::RemovableHandle first =
      ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { fired.push_back(1); });
  self = ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) {
    fired.push_back(2);
    self.remove();  // a hook may remove itself while the hooks run
  });
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { fired.push_back(3); });
  x.sum().backward();
  CHECK(fired == std::vector<int>{1, 2, 3});
  first.remove();
  first.remove();  // again: nothing
  fired.clear();
  x.sum().backward();
  CHECK(fired == std::vector<int>{3});
  CHECK(vec(x.grad()) == std::vector<double>{2.0, 2.0});  // accumulation itself is untouched

  ag::RemovableHandle outlived;
  {
    Tensor y = leaf({1.0});
    outlived = ag::register_post_accumulate_grad_hook(y, [](const Tensor&) {});
  }
  outlived.remove();  // the tensor is gone: nothing to do, no crash
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

// --- hooks under autograd::grad ---------------------------------------------------------------

TEST_CASE("grad runs a captured input's hooks where nothing else runs its node, as PyTorch 2",
          "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  int leaf_calls = 0;
  x.register_hook([&](const Tensor& g) {
    ++leaf_calls;
    return g * 10.0;
  });
  // A leaf: its hook's value is the gradient returned, and nothing lands in .grad.
  std::vector<Tensor> gx = ag::grad({(x * x).sum()}, {x});
  CHECK(leaf_calls == 1);
  CHECK(vec(gx[0]) == std::vector<double>{20.0, 40.0});  // 10 * 2x
  CHECK_FALSE(x.grad().defined());

  // An intermediate, hooked and retained: the hook's value is captured, and .grad keeps it.
  Tensor h = x * 3.0;
  h.register_hook([](const Tensor& g) { return g + 1.0; });
  h.retain_grad();
  std::vector<Tensor> gh = ag::grad({(h * h).sum()}, {h});
  CHECK(vec(gh[0]) == std::vector<double>{7.0, 13.0});  // 2h + 1
  CHECK(vec(h.grad()) == std::vector<double>{7.0, 13.0});
  CHECK(leaf_calls == 1);  // x's node is not on the way to h

  // h's node runs to reach x: h's gradient is captured as it arrived, before its hooks, and
  // the hooked one flows on to x (PyTorch's order too).
  h.set_grad({});
  std::vector<Tensor> both = ag::grad({(h * h).sum()}, {h, x});
  CHECK(vec(both[0]) == std::vector<double>{6.0, 12.0});     // 2h
  CHECK(vec(both[1]) == std::vector<double>{210.0, 390.0});  // 10 * 3 * (2h + 1)
  CHECK(leaf_calls == 2);
}

TEST_CASE("retain_grad keeps the gradient after every hook, whenever it was called, as PyTorch",
          "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 3.0;
  h.retain_grad();  // before the hook: .grad still gets the hooked gradient
  h.register_hook([](const Tensor& g) { return g * 2.0; });
  (h * 1.0).sum().backward();
  CHECK(vec(h.grad()) == std::vector<double>{2.0, 2.0});
  CHECK(vec(x.grad()) == std::vector<double>{6.0, 6.0});
}
