// Finite-difference checks of the elementwise derivative rules (autograd/functions/
// elementwise.cpp): every unary op, every differentiable binary op broadcasting both ways and
// with Scalar operands, where, clamp, masked_fill, the values at kinks and ties (hand-computed,
// PyTorch's conventions), and the gradient dtypes of float32 op float64.
#include <bit>
#include <cstdint>
#include <vector>

#include "tests/autograd/gradcheck_support.h"

using namespace gwtest;

namespace {

struct Unary {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo, hi;
  std::vector<double> avoid;  // non-differentiable points
};

std::vector<Unary> unary_ops() {
  return {
      {"neg", [](const Tensor& x) { return gw::neg(x); }, -2, 2, {}},
      {"operator-", [](const Tensor& x) { return -x; }, -2, 2, {}},
      {"abs", [](const Tensor& x) { return gw::abs(x); }, -2, 2, {0.0}},
      {"exp", [](const Tensor& x) { return gw::exp(x); }, -2, 2, {}},
      {"log", [](const Tensor& x) { return gw::log(x); }, 0.2, 3, {}},
      {"log1p", [](const Tensor& x) { return gw::log1p(x); }, -0.7, 2, {}},
      {"expm1", [](const Tensor& x) { return gw::expm1(x); }, -2, 2, {}},
      {"sqrt", [](const Tensor& x) { return gw::sqrt(x); }, 0.2, 3, {}},
      {"rsqrt", [](const Tensor& x) { return gw::rsqrt(x); }, 0.2, 3, {}},
      {"square", [](const Tensor& x) { return gw::square(x); }, -2, 2, {}},
      {"reciprocal", [](const Tensor& x) { return gw::reciprocal(x); }, -2, 2, {0.0}},
      {"sin", [](const Tensor& x) { return gw::sin(x); }, -3, 3, {}},
      {"cos", [](const Tensor& x) { return gw::cos(x); }, -3, 3, {}},
      {"erf", [](const Tensor& x) { return gw::erf(x); }, -2, 2, {}},
      {"sigmoid", [](const Tensor& x) { return gw::sigmoid(x); }, -4, 4, {}},
      {"tanh", [](const Tensor& x) { return gw::tanh(x); }, -2, 2, {}},
      {"relu", [](const Tensor& x) { return gw::relu(x); }, -2, 2, {0.0}},
      {"gelu", [](const Tensor& x) { return gw::gelu(x); }, -3, 3, {}},
      {"silu", [](const Tensor& x) { return gw::silu(x); }, -4, 4, {}},
      {"gelu(tanh)", [](const Tensor& x) { return gw::gelu(x, "tanh"); }, -3, 3, {}},
      // Method forms go through the same primitives.
      {"Tensor::exp", [](const Tensor& x) { return x.exp(); }, -2, 2, {}},
      {"Tensor::log", [](const Tensor& x) { return x.log(); }, 0.2, 3, {}},
      {"Tensor::sqrt", [](const Tensor& x) { return x.sqrt(); }, 0.2, 3, {}},
      {"Tensor::abs", [](const Tensor& x) { return x.abs(); }, -2, 2, {0.0}},
      {"Tensor::relu", [](const Tensor& x) { return x.relu(); }, -2, 2, {0.0}},
      {"Tensor::sigmoid", [](const Tensor& x) { return x.sigmoid(); }, -3, 3, {}},
      {"Tensor::tanh", [](const Tensor& x) { return x.tanh(); }, -2, 2, {}},
  };
}

// The binary operand shapes: a broadcast over b, b over a, both ways at once, 0-dim operands.
const std::vector<std::pair<Shape, Shape>>& binary_shapes() {
  static const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3}, {2, 3}}, {{2, 1, 3}, {4, 1}}, {{4, 1}, {2, 1, 3}}, {{3}, {2, 3}},
      {{2, 3}, {3}},    {{2, 3}, {}},        {{}, {2, 3}},         {{}, {}},
  };
  return shapes;
}

std::string shapes_label(const std::string& op, const Shape& a, const Shape& b) {
  return op + " " + gw::shape_str(a) + " with " + gw::shape_str(b);
}

}  // namespace

TEST_CASE("gradcheck itself rejects a wrong gradient", "[autograd][gradcheck]") {
  // x * detach(x): the tape sees only one factor, so backward gives x where the finite
  // difference gives 2x. The checks below are only worth something if this one fails.
  Tensor x = uniform({2, 2}, 7, 0.5, 1.5);
  gw::autograd::GradcheckResult r = gw::autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return in[0] * in[0].detach(); }, {x});
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.message, Catch::Contains("analytical") && Catch::Contains("numerical"));
  // The same function written honestly passes.
  CHECK(gw::autograd::gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0]; },
                                {x}).ok);
  // A NaN gradient is not within any tolerance (sqrt(x - 1) at x = 1: infinite slope).
  Tensor one = gw::ones({1}, gw::kFloat64).requires_grad_();
  CHECK_FALSE(gw::autograd::gradcheck(
                  [](const std::vector<Tensor>& in) { return gw::sqrt(in[0] - 1.0); }, {one})
                  .ok);
  Tensor y = uniform({2}, 8, 0.5, 1.5);
  CHECK_FALSE(gw::autograd::gradcheck(
                  [](const std::vector<Tensor>& in) {
                    Tensor out = in[0] * 2.0;
                    if (out.requires_grad())  // not in the finite differences
                      out.register_hook([](const Tensor& g) { return g * std::nan(""); });
                    return out;
                  },
                  {y})
                  .ok);
  // An fn that throws halfway leaves the input as it was; float32 inputs are refused.
  const std::vector<double> before = y.to_vector<double>();
  int calls = 0;
  CHECK_THROWS(gw::autograd::gradcheck(
      [&calls](const std::vector<Tensor>& in) {
        if (++calls > 3) throw std::runtime_error("fn failed");
        return in[0] * 2.0;
      },
      {y}));
  CHECK(y.to_vector<double>() == before);
  CHECK_THROWS_WITH(gw::autograd::gradcheck([](const std::vector<Tensor>& in) { return in[0]; },
                                            {gw::ones({2}).requires_grad_()}),
                    Catch::Contains("[gradcheck]") && Catch::Contains("float32"));
}

TEST_CASE("gradcheck: unary ops on a matrix", "[autograd][gradcheck][elementwise]") {
  uint64_t seed = 1;
  for (const Unary& u : unary_ops()) {
    Tensor x = uniform({2, 3}, seed++, u.lo, u.hi, u.avoid, 0.1);
    expect_gradcheck(u.name, [&u](const std::vector<Tensor>& in) { return u.f(in[0]); }, {x});
  }
}

TEST_CASE("gradcheck: unary ops on 0-dim and non-contiguous inputs",
          "[autograd][gradcheck][elementwise]") {
  uint64_t seed = 100;
  for (const Unary& u : unary_ops()) {
    Tensor s = uniform({}, seed++, u.lo, u.hi, u.avoid, 0.1);
    expect_gradcheck(std::string(u.name) + " (0-dim)",
                     [&u](const std::vector<Tensor>& in) { return u.f(in[0]); }, {s});
    Tensor x = uniform({3, 4}, seed++, u.lo, u.hi, u.avoid, 0.1);
    expect_gradcheck(std::string(u.name) + " (transposed, strided)",
                     [&u](const std::vector<Tensor>& in) {
                       return u.f(in[0].t().slice(0, 0, 4, 2));
                     },
                     {x});
  }
}

TEST_CASE("gradcheck: piecewise-constant unary ops have zero gradient",
          "[autograd][gradcheck][elementwise]") {
  // Away from integers, half-integers and zero each op is locally constant.
  Tensor x = leaf({-2.3, -1.2, -0.3, 0.2, 0.7, 1.3, 2.2, 2.8}, {2, 4});
  expect_gradcheck("sign", [](const std::vector<Tensor>& in) { return gw::sign(in[0]); }, {x});
  expect_gradcheck("floor", [](const std::vector<Tensor>& in) { return gw::floor(in[0]); }, {x});
  expect_gradcheck("ceil", [](const std::vector<Tensor>& in) { return gw::ceil(in[0]); }, {x});
  expect_gradcheck("round", [](const std::vector<Tensor>& in) { return gw::round(in[0]); }, {x});
  // The analytical gradient is explicitly zero (a defined tensor), as in PyTorch.
  Tensor y = (gw::floor(x) * 3.0 + x).sum();
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>(8, 1.0));
}

TEST_CASE("gradcheck: arithmetic broadcasting both ways", "[autograd][gradcheck][elementwise]") {
  uint64_t seed = 200;
  for (const auto& [sa, sb] : binary_shapes()) {
    Tensor a = uniform(sa, seed++, -2, 2), b = uniform(sb, seed++, -2, 2);
    Tensor bnz = nonzero(sb, seed++);
    expect_gradcheck(shapes_label("add", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::add(in[0], in[1]); }, {a, b});
    expect_gradcheck(shapes_label("add alpha=2.5", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::add(in[0], in[1], 2.5); },
                     {a, b});
    expect_gradcheck(shapes_label("sub", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::sub(in[0], in[1]); }, {a, b});
    expect_gradcheck(shapes_label("sub alpha=-0.5", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::sub(in[0], in[1], -0.5); },
                     {a, b});
    expect_gradcheck(shapes_label("mul", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::mul(in[0], in[1]); }, {a, b});
    expect_gradcheck(shapes_label("div", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::div(in[0], in[1]); },
                     {a, bnz});
    expect_gradcheck(shapes_label("operators", sa, sb),
                     [](const std::vector<Tensor>& in) {
                       return (in[0] + in[1]) * in[0] - in[1] / (in[0] * in[0] + 1.0);
                     },
                     {a, b});
  }
}

TEST_CASE("gradcheck: pow, maximum and minimum broadcasting both ways",
          "[autograd][gradcheck][elementwise]") {
  uint64_t seed = 300;
  for (const auto& [sa, sb] : binary_shapes()) {
    Tensor base = uniform(sa, seed++, 0.3, 2.0), expo = uniform(sb, seed++, -2.0, 2.5);
    expect_gradcheck(shapes_label("pow(tensor, tensor)", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::pow(in[0], in[1]); },
                     {base, expo});
    // Independent draws: ties (and near-ties within eps) have probability ~0.
    Tensor a = uniform(sa, seed++, -2, 2), b = uniform(sb, seed++, -2, 2);
    expect_gradcheck(shapes_label("maximum", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::maximum(in[0], in[1]); },
                     {a, b});
    expect_gradcheck(shapes_label("minimum", sa, sb),
                     [](const std::vector<Tensor>& in) { return gw::minimum(in[0], in[1]); },
                     {a, b});
  }
}

TEST_CASE("gradcheck: ops with a Scalar operand", "[autograd][gradcheck][elementwise]") {
  Tensor x = uniform({2, 3}, 400, -2, 2);
  Tensor pos = uniform({2, 3}, 401, 0.3, 2.0);
  Tensor nz = nonzero({2, 3}, 402);
  auto one = [](std::function<Tensor(const Tensor&)> f) {
    return [f](const std::vector<Tensor>& in) { return f(in[0]); };
  };
  expect_gradcheck("x + 2.5", one([](const Tensor& t) { return gw::add(t, 2.5); }), {x});
  expect_gradcheck("2.5 + x", one([](const Tensor& t) { return 2.5 + t; }), {x});
  expect_gradcheck("x - 1.5", one([](const Tensor& t) { return gw::sub(t, 1.5); }), {x});
  expect_gradcheck("1.5 - x", one([](const Tensor& t) { return gw::sub(1.5, t); }), {x});
  expect_gradcheck("x * -3", one([](const Tensor& t) { return gw::mul(t, -3.0); }), {x});
  expect_gradcheck("-3 * x", one([](const Tensor& t) { return -3.0 * t; }), {x});
  expect_gradcheck("x / 4", one([](const Tensor& t) { return gw::div(t, 4.0); }), {x});
  expect_gradcheck("2 / x", one([](const Tensor& t) { return 2.0 / t; }), {nz});
  expect_gradcheck("x * 2 (int scalar)", one([](const Tensor& t) { return t * 2; }), {x});
  expect_gradcheck("pow(x, 3)", one([](const Tensor& t) { return gw::pow(t, 3.0); }), {x});
  expect_gradcheck("pow(x, 2) (square path)", one([](const Tensor& t) { return gw::pow(t, 2.0); }),
                   {x});
  expect_gradcheck("pow(x, 2) int exponent", one([](const Tensor& t) { return gw::pow(t, 2); }),
                   {x});
  expect_gradcheck("pow(x, 0.5)", one([](const Tensor& t) { return gw::pow(t, 0.5); }), {pos});
  expect_gradcheck("pow(x, -1.5)", one([](const Tensor& t) { return gw::pow(t, -1.5); }), {pos});
  expect_gradcheck("pow(x, 1)", one([](const Tensor& t) { return gw::pow(t, 1.0); }), {x});
  expect_gradcheck("pow(x, 0)", one([](const Tensor& t) { return gw::pow(t, 0.0); }), {x});
  expect_gradcheck("Tensor::pow(-2)", one([](const Tensor& t) { return t.pow(-2.0); }), {nz});
}

TEST_CASE("gradcheck: where", "[autograd][gradcheck][elementwise]") {
  Tensor cond = bool_mask({true, false, false, true, true, false}, {2, 3});
  Tensor cond_row = bool_mask({false, true, true}, {3});
  Tensor a = uniform({2, 3}, 500), b = uniform({3}, 501), col = uniform({2, 1}, 502);
  Tensor full_b = uniform({2, 3}, 503);
  expect_gradcheck("where (2,3) (2,3) (3)",
                   [cond](const std::vector<Tensor>& in) { return gw::where(cond, in[0], in[1]); },
                   {a, b});
  expect_gradcheck(
      "where with cond (3), a (2,1), b (2,3)",
      [cond_row](const std::vector<Tensor>& in) { return gw::where(cond_row, in[0], in[1]); },
      {col, full_b});
  expect_gradcheck(
      "where with cond (2,3), a (3), b 0-dim",
      [cond](const std::vector<Tensor>& in) { return gw::where(cond, in[0], in[1]); },
      {uniform({3}, 504), uniform({}, 505)});
  expect_gradcheck("where(cond, 1.5, b)",
                   [cond](const std::vector<Tensor>& in) { return gw::where(cond, 1.5, in[0]); },
                   {full_b});
  expect_gradcheck("where(cond, a, -2.0)",
                   [cond](const std::vector<Tensor>& in) { return gw::where(cond, in[0], -2.0); },
                   {a});
  // Hand-computed: each input gets the upstream gradient where it was picked, summed over
  // the broadcast dims.
  Tensor y = gw::where(cond, a, b);
  Tensor w = make({1, 2, 3, 4, 5, 6}, {2, 3});
  gw::autograd::backward({y}, {w});
  CHECK(vec(a.grad()) == std::vector<double>{1, 0, 0, 4, 5, 0});
  CHECK(vec(b.grad()) == std::vector<double>{0, 2 + 0.0, 3 + 6.0});
}

TEST_CASE("gradcheck: clamp with both bounds and with one", "[autograd][gradcheck][elementwise]") {
  Tensor x = uniform({3, 4}, 600, -1.5, 1.5, {-0.5, 0.5}, 0.05);
  expect_gradcheck("clamp(-0.5, 0.5)",
                   [](const std::vector<Tensor>& in) { return gw::clamp(in[0], -0.5, 0.5); }, {x});
  expect_gradcheck(
      "clamp(min=-0.5)",
      [](const std::vector<Tensor>& in) { return gw::clamp(in[0], -0.5, std::nullopt); }, {x});
  expect_gradcheck(
      "clamp(max=0.5)",
      [](const std::vector<Tensor>& in) { return gw::clamp(in[0], std::nullopt, 0.5); }, {x});
  expect_gradcheck("clamp(int bounds -1, 1)",
                   [](const std::vector<Tensor>& in) { return gw::clamp(in[0], -1, 1); },
                   {uniform({3, 4}, 601, -1.5, 1.5, {-1.0, 1.0}, 0.05)});
}

TEST_CASE("gradcheck: masked_fill", "[autograd][gradcheck][elementwise]") {
  Tensor x = uniform({2, 3}, 700);
  Tensor mask = bool_mask({true, false, true, false, false, true}, {2, 3});
  Tensor row = bool_mask({false, true, false}, {3});
  expect_gradcheck(
      "masked_fill (2,3) mask",
      [mask](const std::vector<Tensor>& in) { return gw::masked_fill(in[0], mask, 7.0); }, {x});
  expect_gradcheck(
      "masked_fill broadcast (3) mask",
      [row](const std::vector<Tensor>& in) { return gw::masked_fill(in[0], row, -1.0); }, {x});
  Tensor y = gw::masked_fill(x, row, 3.0).sum();
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{1, 0, 1, 1, 0, 1});
}

TEST_CASE("gradients at kinks and ties follow PyTorch's conventions",
          "[autograd][elementwise]") {
  SECTION("relu and abs give 0 at 0") {
    Tensor x = leaf({-1.0, 0.0, 2.0}, {3});
    (gw::relu(x) + gw::abs(x) * 10.0).sum().backward();
    CHECK(vec(x.grad()) == std::vector<double>{-10.0, 0.0, 11.0});
  }
  SECTION("clamp passes the gradient at the bounds themselves") {
    Tensor x = leaf({-2.0, -1.0, 0.0, 1.0, 2.0}, {5});
    gw::clamp(x, -1.0, 1.0).sum().backward();
    CHECK(vec(x.grad()) == std::vector<double>{0, 1, 1, 1, 0});
  }
  SECTION("maximum and minimum split a tie evenly") {
    Tensor a = leaf({1.0, 2.0, 3.0}, {3}), b = leaf({1.0, 5.0, 0.0}, {3});
    (gw::maximum(a, b) + gw::minimum(a, b) * 10.0).sum().backward();
    CHECK(vec(a.grad()) == std::vector<double>{5.5, 10.0, 1.0});
    CHECK(vec(b.grad()) == std::vector<double>{5.5, 1.0, 10.0});
  }
  SECTION("pow's exponent gradient at base 0 is 0, its base gradient at exponent 0 is 0") {
    Tensor a = leaf({0.0, 2.0}, {2}), b = leaf({2.0, 0.0}, {2});
    gw::pow(a, b).sum().backward();
    // d/da a^b = b a^(b-1): [2*0, 0]; d/db a^b = a^b log a: [0 (limit), 1*log 2]
    CHECK(vec(a.grad()) == std::vector<double>{0.0, 0.0});
    CHECK(near(vec(b.grad()), {0.0, std::log(2.0)}));
  }
}

TEST_CASE("float32 op float64: each gradient has its own input's dtype",
          "[autograd][elementwise][dtype]") {
  // a float32 (3), b float64 (2,1): the result is float64 (2,3).
  auto a_values = std::vector<float>{1.5f, -2.0f, 1.0f};
  auto fresh = [&] {
    Tensor a = gw::from_vector<float>(a_values).requires_grad_();
    Tensor b = leaf({0.25, 4.0}, {2, 1});
    return std::pair{a, b};
  };
  SECTION("mul") {
    auto [a, b] = fresh();
    Tensor y = gw::mul(a, b);
    CHECK(y.dtype() == gw::kFloat64);
    y.sum().backward();
    REQUIRE(a.grad().defined());
    REQUIRE(b.grad().defined());
    CHECK(a.grad().dtype() == gw::kFloat32);
    CHECK(b.grad().dtype() == gw::kFloat64);
    CHECK(vec(a.grad()) == std::vector<double>{4.25, 4.25, 4.25});  // sum of b
    CHECK(vec(b.grad()) == std::vector<double>{0.5, 0.5});          // sum of a
  }
  SECTION("add, sub with alpha, div") {
    auto [a, b] = fresh();
    Tensor y = gw::add(a, b) + gw::sub(a, b, 2.0) + gw::div(a, b);
    y.sum().backward();
    CHECK(a.grad().dtype() == gw::kFloat32);
    CHECK(b.grad().dtype() == gw::kFloat64);
    // d/da: 1 + 1 + sum_rows 1/b = 2*2 + (4 + 0.25)
    CHECK(vec(a.grad()) == std::vector<double>{8.25, 8.25, 8.25});
    // d/db per row: 3 * (1 - 2) - sum(a) / b^2 = -3 - 0.5 / b^2
    CHECK(near(vec(b.grad()), {-3.0 - 0.5 / 0.0625, -3.0 - 0.5 / 16.0}));
  }
  SECTION("pow, maximum, minimum, where") {
    Tensor a = gw::from_vector<float>({0.5f, 2.0f, 3.0f}).requires_grad_();
    Tensor b = leaf({1.0, 2.5, 2.0}, {3});
    Tensor cond = bool_mask({true, false, true}, {3});
    Tensor y = gw::pow(a, b) + gw::maximum(a, b) * 10.0 + gw::minimum(a, b) * 100.0 +
               gw::where(cond, a, b) * 1000.0;
    y.sum().backward();
    CHECK(a.grad().dtype() == gw::kFloat32);
    CHECK(b.grad().dtype() == gw::kFloat64);
    // pow: b a^(b-1) = [1, 2.5*2^1.5, 2*3]; max picks b,b,a; min picks a,a,b; where a,b,a
    std::vector<double> ga = {1.0 + 100 + 1000, 2.5 * std::pow(2.0, 1.5) + 100,
                              6.0 + 10 + 1000};
    std::vector<double> gb = {std::pow(0.5, 1.0) * std::log(0.5) + 10,
                              std::pow(2.0, 2.5) * std::log(2.0) + 10 + 1000,
                              9.0 * std::log(3.0) + 100};
    CHECK(near(vec(a.grad()), ga, 1e-6));  // float32 storage of the result
    CHECK(near(vec(b.grad()), gb, 1e-6));
  }
  SECTION("a 0-dim float64 operand keeps the float32 result but gets a float64 gradient") {
    Tensor a = gw::from_vector<float>(a_values).requires_grad_();
    Tensor s = leaf({3.0}, {});
    Tensor y = gw::mul(a, s);
    CHECK(y.dtype() == gw::kFloat32);
    y.sum().backward();
    CHECK(a.grad().dtype() == gw::kFloat32);
    CHECK(s.grad().dtype() == gw::kFloat64);
    CHECK(s.grad().dim() == 0);
    CHECK(vec(a.grad()) == std::vector<double>{3.0, 3.0, 3.0});
    CHECK(vec(s.grad()) == std::vector<double>{0.5});
  }
}

TEST_CASE("the fused activation derivatives equal their composition from ops",
          "[autograd][elementwise]") {
  // unary_derivative runs one fused pass when nothing records (a backward), and composes the
  // rule from ops when it is itself recorded (here: x requires grad, recording on).
  for (gw::DType dtype : {gw::kFloat32, gw::kFloat64}) {
    // (ReLU's rule reads its output, never recorded here: the next case checks its fused pass.)
    for (gw::UnaryOp op : {gw::UnaryOp::Gelu, gw::UnaryOp::GeluTanh, gw::UnaryOp::Silu}) {
      INFO(gw::op_name(op) << " " << dtype);
      gw::Generator gen(7);
      Tensor x = (gw::randn({1000}, gen, dtype) * 4).requires_grad_();
      Tensor g = gw::randn({1000}, gen, dtype);
      Tensor composed = gw::unary_derivative(op, g, x, {});
      REQUIRE(composed.requires_grad());  // recorded: the composition
      Tensor fused;
      {
        gw::detail::NoRecordScope no_record;
        fused = gw::unary_derivative(op, g, x.detach(), {});
      }
      const double tol = dtype == gw::kFloat32 ? 1e-5 : 1e-13;
      CHECK(gw::allclose(fused, composed.detach(), tol, tol));
    }
  }
}

TEST_CASE("ReLU's fused derivative passes the gradient where the input is positive only",
          "[autograd][elementwise]") {
  // As where(relu(x) > 0, g, 0): zero at 0, -0, NaN and below; g itself (even inf) above.
  Tensor x = gw::from_vector<float>({-INFINITY, -1, -0.0f, 0, 1e-40f, 2, INFINITY, NAN});
  Tensor g = gw::from_vector<float>({5, 5, 5, 5, 5, INFINITY, 5, 5});
  gw::detail::NoRecordScope no_record;  // the fused derivative
  Tensor got = gw::unary_derivative(gw::UnaryOp::Relu, g, x, gw::relu(x));
  CHECK(got.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 5, INFINITY, 5, 0});
  CHECK(gw::equal(got, gw::where(gw::gt(gw::relu(x), 0), g, gw::Scalar(0.0))));
}

TEST_CASE("GELU and its derivative at extremes: infinities, NaN, huge and tiny values",
          "[autograd][elementwise]") {
  // float32 runs on approximations of exp and erf (core/cpu/elementwise_kernels.cpp); their
  // values at the edges must be what the float64 formulas give.
  const std::vector<double> xs = {-INFINITY, -3e38, -1e20, -30, -9.5, -1e-40, 0,
                                  1e-40,     1e-8,  9.5,   30,  1e20, 3e38,   INFINITY};
  Tensor x64 = gw::from_vector(xs);
  Tensor x32 = x64.to(gw::kFloat32);
  auto check = [&](const Tensor& got32, const Tensor& want64, const char* what) {
    std::vector<double> got = got32.to(gw::kFloat64).to_vector<double>();
    std::vector<double> want = want64.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO(what << " at x = " << xs[i] << ": float32 " << got[i] << ", float64 " << want[i]);
      if (std::isnan(want[i])) {
        CHECK(std::isnan(got[i]));
      } else if (std::isinf(want[i]) || std::abs(want[i]) > 1e30) {
        CHECK(got[i] == static_cast<double>(static_cast<float>(want[i])));
      } else {
        CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])));
      }
    }
  };
  check(gw::gelu(x32), gw::gelu(x64), "gelu");
  gw::detail::NoRecordScope no_record;  // the fused derivative
  const Tensor g64 = gw::ones({static_cast<int64_t>(xs.size())}, gw::kFloat64);
  check(gw::unary_derivative(gw::UnaryOp::Gelu, g64.to(gw::kFloat32), x32, {}),
        gw::unary_derivative(gw::UnaryOp::Gelu, g64, x64, {}), "gelu'");
  for (float v : gw::gelu(gw::full({3}, std::nan(""))).to_vector<float>()) CHECK(std::isnan(v));
}

TEST_CASE("float32 GELU and its derivative give the same bits on contiguous and strided tensors",
          "[autograd][elementwise]") {
  // Contiguous rows may run a sixteen-lane form of the formulas (AVX-512 builds), the last
  // partial group masked; strided ones run the scalar form. Every element must get the same
  // bits, the extremes' included: zeros, infinities, denormals, and |x| around 13.19, where
  // exp(-x²/2) leaves its range. A NaN stays a NaN (which NaN's sign comes out of an operation
  // on two is the compiler's choice of operand order).
  auto bits = [](const Tensor& t) {
    std::vector<uint32_t> out;
    for (float v : t.to_vector<float>())
      out.push_back(std::isnan(v) ? 0x7fc00000u : std::bit_cast<uint32_t>(v));
    return out;
  };
  const std::vector<float> extremes = {0.0f,   -0.0f,   INFINITY, -INFINITY, NAN,    -NAN,
                                       1e-40f, -1e-40f, 3e38f,    -3e38f,    13.15f, -13.2f};
  gw::Generator gen(3);
  for (int64_t n : {2, 15, 16, 17, 1003}) {
    INFO("n = " << n);
    Tensor base = gw::randn({2 * n}, gen) * 6;
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(extremes.size()); ++i)
      base.narrow(0, 2 * i, 1).fill_(extremes[static_cast<size_t>(i)]);
    Tensor strided = base.slice(0, 0, 2 * n, 2);
    Tensor dense = strided.contiguous();
    REQUIRE_FALSE(strided.is_contiguous());
    CHECK(bits(gw::gelu(dense)) == bits(gw::gelu(strided)));
    Tensor g = gw::randn({2 * n}, gen).slice(0, 0, 2 * n, 2);
    gw::detail::NoRecordScope no_record;  // the fused derivative
    CHECK(bits(gw::unary_derivative(gw::UnaryOp::Gelu, g.contiguous(), dense, {})) ==
          bits(gw::unary_derivative(gw::UnaryOp::Gelu, g, strided, {})));
  }
}
