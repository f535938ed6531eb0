// The engine beyond single chains: leaves shared by branches and by one op, autograd::grad's
// options, the errors, and grad-mode guards.
#include <catch2/catch.hpp>

#include <thread>

#include "tests/autograd/engine_test_util.h"

using namespace engine_test;

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
  SECTION("a hook that changes the gradient's shape or dtype") {
    // g.expand((3, 2)) would be summed back into x's gradient three times over.
    Tensor h = x * constant({3.0, 4.0});
    h.register_hook([](const Tensor& g) { return g.expand({3, 2}).contiguous(); });
    CHECK_THROWS_WITH(h.sum().backward(), Catch::Contains("[backward]") &&
                                              Catch::Contains("(3,2) float64") &&
                                              Catch::Contains("(2) float64 gradient"));
    Tensor y = gw::ones({2}).requires_grad_();
    y.register_hook([](const Tensor& g) { return g.to(gw::kFloat64); });
    CHECK_THROWS_WITH((y * 2.0).sum().backward(), Catch::Contains("(2) float64 tensor") &&
                                                      Catch::Contains("(2) float32 gradient"));
    CHECK_FALSE(y.grad().defined());
    CHECK_THROWS_WITH(y.set_grad(gw::ones({2}, gw::kFloat64)),
                      Catch::Contains("[set_grad]") && Catch::Contains("float64 gradient"));
  }
  SECTION("an in-place op whose other operand requires grad") {
    // acc += w * 3 would leave w without a gradient: refused, as copy_ of it is.
    Tensor acc = constant({0.0, 0.0});
    CHECK_THROWS_WITH(acc += x * 3.0,
                      Catch::Contains("[add_]") && Catch::Contains("requires grad"));
    CHECK_THROWS_WITH(acc.mul_(x), Catch::Contains("[mul_]"));
    const Tensor s = gw::scalar_tensor(2.0).requires_grad_();  // a 0-dim operand as well
    CHECK_THROWS_WITH(acc.mul_(s), Catch::Contains("[mul_]") && Catch::Contains("requires grad"));
    CHECK_THROWS_WITH(acc.scatter_add_(0, gw::from_vector<int64_t>({0, 1}), x),
                      Catch::Contains("[scatter_add_]") && Catch::Contains("src requires grad"));
    CHECK(vec(acc) == std::vector<double>{0.0, 0.0});
    {
      ag::NoGradGuard no_grad;  // what optimizers do
      acc += x * 3.0;
    }
    CHECK(vec(acc) == std::vector<double>{3.0, 6.0});
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

// --- marking leaves -----------------------------------------------------------------------------

TEST_CASE("leaves made by requires_grad_ and by factories record their history",
          "[autograd][leaves]") {
  Tensor ints = gw::zeros({3}, gw::kInt64);
  CHECK_THROWS_WITH(ints.requires_grad_(),
                    Catch::Contains("[requires_grad_]") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(gw::zeros({2}, gw::TensorOptions(gw::kInt32).with_requires_grad(true)),
                    Catch::Contains("[zeros]") && Catch::Contains("int32"));
  Tensor x = gw::tensor({1.f, 2.f});
  x.requires_grad_();
  CHECK(x.str() == "tensor([1., 2.], requires_grad=True)");
  Tensor w = gw::ones({2}, gw::TensorOptions(gw::kFloat32).with_requires_grad(true));
  CHECK(w.requires_grad());
  (w * x).sum().backward();
  CHECK(vec(w.grad()) == std::vector<double>{1.0, 2.0});
  CHECK(vec(x.grad()) == std::vector<double>{1.0, 1.0});
  x.requires_grad_(false);
  CHECK_FALSE((x * 2.0f).requires_grad());
}
