// Engine behaviour: dependency counting, accumulation, hooks, retain_graph, errors.
#include <catch2/catch.hpp>

#include "autograd/autograd.h"
#include "tests/autograd/engine_test_util.h"

using gw::Tensor;
using engine_test::leaf;
using engine_test::vec;

TEST_CASE("a chain of ops gives the analytic gradient", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0, 3.0});
  Tensor y = (x * x * 3.0 + x).sum();  // dy/dx = 6x + 1
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{7.0, 13.0, 19.0});
  CHECK(x.is_leaf());
  CHECK_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn() != nullptr);
}

TEST_CASE("diamond graphs sum the gradients that meet at a node", "[autograd][engine]") {
  Tensor x = leaf({2.0});
  Tensor a = x * 3.0, b = x * 5.0;
  Tensor y = (a * b).sum();  // 15 x^2 -> 30 x
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{60.0});
}

TEST_CASE("gradients that meet are summed without writing into a tensor another sees",
          "[autograd][engine]") {
  // The engine may sum into the gradient it holds when nothing else sees that memory. Not here:
  // sum's gradient is one value expanded (each element the same memory), and add hands one
  // gradient tensor to both its edges. Both orders of arrival.
  Tensor x = leaf({1.0, 2.0, 3.0});
  (x.sum() + (x * x).sum()).backward();  // 1 + 2x
  CHECK(vec(x.grad()) == std::vector<double>{3.0, 5.0, 7.0});
  x.set_grad({});
  ((x * x).sum() + x.sum()).backward();
  CHECK(vec(x.grad()) == std::vector<double>{3.0, 5.0, 7.0});
  x.set_grad({});
  Tensor a = x * 2.0;
  ((a + a) * (a + a)).sum().backward();  // 4 a^2 = 16 x^2 -> 32 x
  CHECK(vec(x.grad()) == std::vector<double>{32.0, 64.0, 96.0});
  x.set_grad({});
  Tensor g = gw::ones({3}, gw::kFloat64);
  Tensor seen = g.clone();
  (x + x + x).backward(g);  // g itself reaches every edge
  CHECK(vec(x.grad()) == std::vector<double>{3.0, 3.0, 3.0});
  CHECK(gw::equal(g, seen));
  // A view of g (a tensor of its own on g's memory), first or second to arrive.
  const Tensor g_row = g.view({1, 3}), seen_row = g_row.clone();
  for (bool view_first : {false, true}) {
    x.set_grad({});
    Tensor viewed, scaled;  // of the ready nodes, the engine runs the later-made first
    if (view_first) scaled = (x * 1.0).view({1, 3});
    viewed = x.view({1, 3});
    if (!view_first) scaled = (x * 1.0).view({1, 3});
    (viewed + scaled).backward(g_row);
    CHECK(vec(x.grad()) == std::vector<double>{2.0, 2.0, 2.0});
    CHECK(gw::equal(g_row, seen_row));
  }
}

TEST_CASE("gradients accumulate across backward calls until cleared", "[autograd][engine]") {
  Tensor x = leaf({1.0, -1.0});
  (x * 2.0).sum().backward();
  (x * 3.0).sum().backward();
  CHECK(vec(x.grad()) == std::vector<double>{5.0, 5.0});
  x.set_grad({});
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("unreached branches do not run", "[autograd][engine]") {
  Tensor x = leaf({1.0}), z = leaf({1.0});
  bool ran = false;
  z.register_hook([&](const Tensor& g) {
    ran = true;
    return g;
  });
  Tensor unused = (z * 2.0).sum();
  (x * 4.0).sum().backward();
  CHECK_FALSE(ran);
  CHECK_FALSE(z.grad().defined());
  (void)unused;
}

TEST_CASE("backward twice without retain_graph is an error", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = (x * x).sum();
  y.backward({}, true);
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{4.0, 8.0});
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("second time"));
}

TEST_CASE("a saved tensor modified in place is reported", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor a = x * 2.0;
  Tensor y = (a * a).sum();
  {
    gw::autograd::NoGradGuard no_grad;
    a.add_(1.0);
  }
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation"));
}

TEST_CASE("non-scalar roots need a gradient", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("only for scalar outputs"));
  y.backward(gw::from_vector<double>({1.0, 10.0}));
  CHECK(vec(x.grad()) == std::vector<double>{2.0, 20.0});
}

TEST_CASE("grad returns gradients without touching .grad", "[autograd][engine]") {
  Tensor x = leaf({3.0}), w = leaf({2.0});
  Tensor y = (x * w).sum();
  auto g = gw::autograd::grad({y}, {x});
  CHECK(vec(g[0]) == std::vector<double>{2.0});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  Tensor c = gw::from_vector<double>({1.0});
  CHECK_THROWS_WITH(gw::autograd::grad({(x * 2.0).sum()}, {c}),
                    Catch::Contains("does not require grad"));
}

TEST_CASE("hooks can replace gradients, post-accumulate hooks see .grad", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 2.0;
  h.register_hook([](const Tensor& g) { return g * 10.0; });
  std::vector<double> seen;
  gw::autograd::register_post_accumulate_grad_hook(x, [&](const Tensor& p) { seen = vec(p.grad()); });
  h.sum().backward();
  CHECK(vec(x.grad()) == std::vector<double>{20.0, 20.0});
  CHECK(seen == std::vector<double>{20.0, 20.0});
}

TEST_CASE("retain_grad keeps a non-leaf gradient", "[autograd][engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = x * 3.0;
  h.retain_grad();
  (h * h).sum().backward();
  CHECK(vec(h.grad()) == std::vector<double>{6.0, 12.0});
}

TEST_CASE("NoGradGuard records nothing", "[autograd][engine]") {
  Tensor x = leaf({1.0});
  gw::autograd::NoGradGuard no_grad;
  Tensor y = x * 2.0;
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
}

TEST_CASE("in-place ops on leaves that require grad are refused", "[autograd][engine]") {
  Tensor x = leaf({1.0});
  CHECK_THROWS_WITH(x.add_(1.0), Catch::Contains("[add_]"));
  gw::autograd::NoGradGuard no_grad;
  x.add_(1.0);
  CHECK(vec(x) == std::vector<double>{2.0});
}
