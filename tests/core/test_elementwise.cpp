// Arithmetic elementwise ops (core/ops/elementwise.h): values against std:: math computed here,
// PyTorch broadcasting against a reference written in the test, type promotion, strided inputs
// and the operators. Comparisons, where, allclose and NaN handling are in test_compare.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "core/cpu/cpu_allocator.h"
#include "core/memory.h"
#include "core/ops.h"
#include "test_util.h"

using core_test::broadcast_ref;
using core_test::make;
using core_test::source_index;
using gw::Shape;
using gw::Tensor;

namespace {

// Deterministic nonzero test values: multiples of 1/4 offset by 1/8, in [-1.875, 2.125].
std::vector<double> sample(int64_t n, int seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + seed * 11) % 17 - 8) * 0.25 + 0.125;
  return v;
}

// f applied elementwise to a and b broadcast together, in plain C++ (no gradwire code).
template <typename F>
std::vector<double> binary_ref(const std::vector<double>& a, const Shape& sa,
                               const std::vector<double>& b, const Shape& sb, F f) {
  Shape out = broadcast_ref(sa, sb);
  std::vector<double> r;
  int64_t total = gw::numel(out);
  std::vector<int64_t> idx(out.size(), 0);
  for (int64_t i = 0; i < total; ++i) {
    r.push_back(f(a[source_index(sa, idx)], b[source_index(sb, idx)]));
    for (size_t d = out.size(); d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return r;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double eps) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i, want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(got[i] == Approx(want[i]).epsilon(eps).margin(eps));
    }
  }
}

std::vector<double> map_values(const std::vector<double>& v, const std::function<double(double)>& f) {
  std::vector<double> r;
  for (double x : v) r.push_back(f(x));
  return r;
}

double round_half_even(double x) {
  double f = std::floor(x), diff = x - f;
  if (diff < 0.5) return f;
  if (diff > 0.5) return f + 1;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  std::vector<double> inputs;
};

const std::vector<double> kGeneral{-3.5, -1.25, -0.5, 0.0, 0.3, 1.0, 2.75, 10.0};
const std::vector<double> kPositive{0.01, 0.5, 1.0, 2.5, 100.0};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return gw::neg(x); }, [](double x) { return -x; }, kGeneral},
      {"abs", [](const Tensor& x) { return gw::abs(x); }, [](double x) { return std::fabs(x); },
       kGeneral},
      {"exp", [](const Tensor& x) { return gw::exp(x); }, [](double x) { return std::exp(x); },
       kGeneral},
      {"log", [](const Tensor& x) { return gw::log(x); }, [](double x) { return std::log(x); },
       kPositive},
      {"log1p",
       [](const Tensor& x) { return gw::log1p(x); },
       [](double x) { return std::log1p(x); },
       {-0.5, 0.0, 1e-7, 3.0}},
      {"expm1",
       [](const Tensor& x) { return gw::expm1(x); },
       [](double x) { return std::expm1(x); },
       {-2.0, -1e-7, 0.0, 1e-6, 4.0}},
      {"sqrt", [](const Tensor& x) { return gw::sqrt(x); }, [](double x) { return std::sqrt(x); },
       kPositive},
      {"rsqrt", [](const Tensor& x) { return gw::rsqrt(x); },
       [](double x) { return 1.0 / std::sqrt(x); }, kPositive},
      {"square", [](const Tensor& x) { return gw::square(x); }, [](double x) { return x * x; },
       kGeneral},
      {"reciprocal",
       [](const Tensor& x) { return gw::reciprocal(x); },
       [](double x) { return 1.0 / x; },
       {-4.0, -0.5, 0.25, 3.0}},
      {"sin", [](const Tensor& x) { return gw::sin(x); }, [](double x) { return std::sin(x); },
       kGeneral},
      {"cos", [](const Tensor& x) { return gw::cos(x); }, [](double x) { return std::cos(x); },
       kGeneral},
      {"sign", [](const Tensor& x) { return gw::sign(x); },
       [](double x) { return x > 0   ? 1.0
                             : x < 0 ? -1.0
                                     : 0.0; }, kGeneral},
      {"floor",
       [](const Tensor& x) { return gw::floor(x); },
       [](double x) { return std::floor(x); },
       {-2.5, -1.7, -0.5, 0.5, 1.2, 2.5}},
      {"ceil",
       [](const Tensor& x) { return gw::ceil(x); },
       [](double x) { return std::ceil(x); },
       {-2.5, -1.7, -0.5, 0.5, 1.2, 2.5}},
      {"round (half to even)",
       [](const Tensor& x) { return gw::round(x); },
       round_half_even,
       {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -1.7, 1.2, 3.49}},
      {"relu", [](const Tensor& x) { return gw::relu(x); },
       [](double x) { return x > 0 ? x : 0.0; }, kGeneral},
      {"sigmoid", [](const Tensor& x) { return gw::sigmoid(x); },
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, kGeneral},
      {"tanh", [](const Tensor& x) { return gw::tanh(x); }, [](double x) { return std::tanh(x); },
       kGeneral},
      {"gelu", [](const Tensor& x) { return gw::gelu(x); },
       [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, kGeneral},
      {"silu",
       [](const Tensor& x) { return gw::silu(x); },
       [](double x) { return x / (1.0 + std::exp(-x)); },
       {-30.0, -2.5, -0.5, 0.0, 0.5, 2.5, 30.0}},
      {"gelu tanh", [](const Tensor& x) { return gw::gelu(x, "tanh"); },
       [](double x) {
         const double k = std::sqrt(2.0 / std::numbers::pi);
         return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
       },
       kGeneral},
  };
}

}  // namespace

// --- unary ----------------------------------------------------------------------------------

TEST_CASE("unary ops match std:: math in float64 and float32", "[core][elementwise]") {
  for (const UnaryCase& c : unary_cases()) {
    CAPTURE(c.name);
    const Shape shape{static_cast<int64_t>(c.inputs.size())};
    std::vector<double> want = map_values(c.inputs, c.ref);

    Tensor d = c.op(gw::from_vector(c.inputs, shape));
    CHECK(d.dtype() == gw::kFloat64);
    CHECK(d.sizes() == shape);
    check_close(d.to_vector<double>(), want, 1e-12);

    // float32: the reference is evaluated on the float-rounded inputs.
    std::vector<float> f(c.inputs.begin(), c.inputs.end());
    std::vector<double> wantf = map_values(std::vector<double>(f.begin(), f.end()), c.ref);
    Tensor s = c.op(gw::from_vector(f));
    CHECK(s.dtype() == gw::kFloat32);
    check_close(s.to_vector<double>(), wantf, 2e-6);
  }
}

TEST_CASE("unary ops on 0-dim, size-0 and strided inputs", "[core][elementwise]") {
  Tensor z = gw::exp(gw::scalar_tensor(1.0, gw::kFloat64));
  CHECK(z.dim() == 0);
  CHECK(z.item<double>() == Approx(std::exp(1.0)));
  Tensor e = gw::sqrt(gw::zeros({2, 0}));
  CHECK(e.sizes() == Shape{2, 0});
  std::vector<double> v = sample(12, 1);
  Tensor m = gw::from_vector(v, {3, 4});
  Tensor strided = m.t().slice(0, 0, 4, 2);  // (2,3): m[:, 0] and m[:, 2]
  Tensor r = gw::tanh(strided);
  CHECK(r.sizes() == Shape{2, 3});
  CHECK(r.is_contiguous());
  std::vector<double> want;
  for (int k : {0, 2})
    for (int i = 0; i < 3; ++i) want.push_back(std::tanh(v[i * 4 + k]));
  check_close(r.to_vector<double>(), want, 1e-12);
}

TEST_CASE("sigmoid saturates without overflow", "[core][elementwise]") {
  std::vector<double> big{-1000.0, -50.0, 50.0, 1000.0};
  std::vector<double> got = gw::sigmoid(gw::from_vector(big)).to_vector<double>();
  CHECK(got[0] == Approx(0.0).margin(1e-300));
  CHECK(got[1] == Approx(1.0 / (1.0 + std::exp(50.0))).epsilon(1e-12));
  CHECK(got[2] == Approx(1.0));
  CHECK(got[3] == 1.0);
  for (double x : got) CHECK_FALSE(std::isnan(x));
  std::vector<float> gotf = gw::sigmoid(gw::from_vector<float>({-200.f, 200.f})).to_vector<float>();
  CHECK(gotf[0] == 0.f);
  CHECK(gotf[1] == 1.f);
}

TEST_CASE("unary ops on integer and bool tensors", "[core][elementwise]") {
  Tensor i = gw::from_vector<int64_t>({-3, 0, 2});
  SECTION("sign-like ops keep the integer dtype") {
    CHECK(gw::neg(i).dtype() == gw::kInt64);
    CHECK(gw::neg(i).to_vector<int64_t>() == std::vector<int64_t>{3, 0, -2});
    CHECK(gw::abs(i).to_vector<int64_t>() == std::vector<int64_t>{3, 0, 2});
    CHECK(gw::square(i).to_vector<int64_t>() == std::vector<int64_t>{9, 0, 4});
    CHECK(gw::sign(i).to_vector<int64_t>() == std::vector<int64_t>{-1, 0, 1});
    CHECK(gw::relu(i).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 2});
    Tensor i32 = gw::from_vector<int32_t>({-3, 4});
    CHECK(gw::abs(i32).dtype() == gw::kInt32);
    CHECK(gw::floor(i32).dtype() == gw::kInt32);
    CHECK(gw::round(i32).to_vector<int32_t>() == std::vector<int32_t>{-3, 4});
  }
  SECTION("transcendental ops of integers compute in float32") {
    Tensor r = gw::exp(i);
    CHECK(r.dtype() == gw::kFloat32);
    check_close(r.to_vector<double>(),
                {double(std::exp(-3.f)), double(std::exp(0.f)), double(std::exp(2.f))}, 1e-6);
    CHECK(gw::sqrt(gw::from_vector<int32_t>({4, 9})).to_vector<float>() ==
          std::vector<float>{2.f, 3.f});
    CHECK(gw::sigmoid(gw::from_vector<bool>({true})).dtype() == gw::kFloat32);
  }
  SECTION("logical_not gives bool") {
    Tensor n = gw::logical_not(gw::from_vector<double>({0.0, -1.5, 2.0}));
    CHECK(n.dtype() == gw::kBool);
    CHECK(n.to_vector<bool>() == std::vector<bool>{true, false, false});
    CHECK(gw::logical_not(gw::from_vector<bool>({true, false})).to_vector<bool>() ==
          std::vector<bool>{false, true});
  }
}

// --- binary and broadcasting ----------------------------------------------------------------

TEST_CASE("binary ops broadcast like PyTorch", "[core][elementwise][broadcast]") {
  const std::vector<std::pair<Shape, Shape>> pairs{
      {{}, {}},           {{3}, {}},         {{}, {2, 3}},       {{2, 3}, {3}},
      {{2, 1}, {1, 3}},   {{4, 1, 3}, {2, 1}}, {{5, 1, 1}, {1, 4, 1}}, {{1}, {0}},
      {{2, 0}, {2, 1}},   {{0, 3}, {3}},     {{2, 3, 4}, {2, 3, 4}}, {{1, 1}, {2, 3, 1, 1}},
      {{3, 1}, {3, 4}},   {{1}, {5}},
  };
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> op;
    std::function<double(double, double)> ref;
  };
  const std::vector<Op> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return gw::add(a, b); },
       [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return gw::sub(a, b); },
       [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return gw::mul(a, b); },
       [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return gw::div(a, b); },
       [](double a, double b) { return a / b; }},
      {"pow", [](const Tensor& a, const Tensor& b) { return gw::pow(gw::abs(a), b); },
       [](double a, double b) { return std::pow(std::fabs(a), b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return gw::maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return gw::minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }},
  };
  for (const auto& [sa, sb] : pairs) {
    std::vector<double> a = sample(gw::numel(sa), 1), b = sample(gw::numel(sb), 2);
    Shape want_shape = broadcast_ref(sa, sb);
    for (const Op& op : ops) {
      CAPTURE(op.name, gw::shape_str(sa), gw::shape_str(sb));
      Tensor r = op.op(make(a, sa), make(b, sb));
      CHECK(r.sizes() == want_shape);
      CHECK(r.dtype() == gw::kFloat64);
      check_close(r.to_vector<double>(), binary_ref(a, sa, b, sb, op.ref), 1e-12);
      // float32 computes the same thing to float precision
      Tensor rf = op.op(make(a, sa, gw::kFloat32), make(b, sb, gw::kFloat32));
      CHECK(rf.dtype() == gw::kFloat32);
      check_close(rf.to_vector<double>(), binary_ref(a, sa, b, sb, op.ref), 1e-5);
    }
  }
}

TEST_CASE("broadcast_shapes follows the PyTorch rules", "[core][elementwise][broadcast]") {
  CHECK(gw::broadcast_shapes(Shape{}, Shape{}, "t") == Shape{});
  CHECK(gw::broadcast_shapes(Shape{3, 1, 5}, Shape{4, 1}, "t") == Shape{3, 4, 5});
  CHECK(gw::broadcast_shapes(Shape{1}, Shape{0}, "t") == Shape{0});
  CHECK(gw::broadcast_shapes(Shape{0, 1}, Shape{1, 7}, "t") == Shape{0, 7});
  CHECK_THROWS_AS(gw::broadcast_shapes(Shape{2}, Shape{3}, "t"), gw::ShapeError);
  CHECK_THROWS_AS(gw::broadcast_shapes(Shape{2, 0}, Shape{3}, "t"), gw::ShapeError);
}

TEST_CASE("add and sub take an alpha multiplier", "[core][elementwise]") {
  std::vector<double> a = sample(6, 3), b = sample(3, 4);
  Tensor ta = make(a, {2, 3}), tb = make(b, {3});
  check_close(gw::add(ta, tb, 2.5).to_vector<double>(),
              binary_ref(a, {2, 3}, b, {3}, [](double x, double y) { return x + 2.5 * y; }),
              1e-12);
  check_close(gw::sub(ta, tb, -3).to_vector<double>(),
              binary_ref(a, {2, 3}, b, {3}, [](double x, double y) { return x + 3 * y; }), 1e-12);
  Tensor ints = gw::add(gw::from_vector<int64_t>({1, 2}), gw::from_vector<int64_t>({10, 20}), 3);
  CHECK(ints.dtype() == gw::kInt64);
  CHECK(ints.to_vector<int64_t>() == std::vector<int64_t>{31, 62});
}

TEST_CASE("pow with tensor and scalar exponents", "[core][elementwise]") {
  std::vector<double> base{0.5, 1.0, 2.0, 3.0};
  Tensor b = gw::from_vector(base);
  for (double e : {2.0, 0.5, -1.0, 3.0, 0.0}) {
    CAPTURE(e);
    Tensor r = gw::pow(b, e);
    CHECK(r.dtype() == gw::kFloat64);
    check_close(r.to_vector<double>(), map_values(base, [e](double x) { return std::pow(x, e); }),
                1e-12);
    CHECK(gw::equal(b.pow(e), r));
  }
  Tensor i = gw::from_vector<int32_t>({-2, 3, 5});
  Tensor cube = gw::pow(i, 3);
  CHECK(cube.dtype() == gw::kInt32);
  CHECK(cube.to_vector<int32_t>() == std::vector<int32_t>{-8, 27, 125});
  CHECK(gw::pow(i, 2).to_vector<int32_t>() == std::vector<int32_t>{4, 9, 25});
  Tensor half = gw::pow(gw::from_vector<int64_t>({4, 9}), 0.5);
  CHECK(half.dtype() == gw::kFloat32);
  CHECK(half.to_vector<float>() == std::vector<float>{2.f, 3.f});
  Tensor te = gw::pow(gw::from_vector<int64_t>({2, 3}), gw::from_vector<int64_t>({10, 3}));
  CHECK(te.to_vector<int64_t>() == std::vector<int64_t>{1024, 27});
}

// --- type promotion -------------------------------------------------------------------------

TEST_CASE("result_type and op dtypes follow PyTorch's promotion rules",
          "[core][elementwise][promotion]") {
  Tensor i32 = gw::from_vector<int32_t>({1, 2, 7});
  Tensor i64 = gw::from_vector<int64_t>({3, 4, 2});
  Tensor f32 = gw::from_vector<float>({0.5f, 1.5f, 2.5f});
  Tensor f64 = gw::from_vector<double>({0.25, 0.5, 0.75});
  Tensor b = gw::from_vector<bool>({true, false, true});
  Tensor f64_0d = gw::scalar_tensor(2.5, gw::kFloat64);
  Tensor i64_0d = gw::scalar_tensor(int64_t{5});

  SECTION("int32 + int64 tensors -> int64") {
    CHECK(gw::result_type(i32, i64) == gw::kInt64);
    Tensor r = i32 + i64;
    CHECK(r.dtype() == gw::kInt64);
    CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{4, 6, 9});
  }
  SECTION("int32 tensor + 2.5 -> float32") {
    CHECK(gw::result_type(i32, 2.5) == gw::kFloat32);
    Tensor r = i32 + 2.5;
    CHECK(r.dtype() == gw::kFloat32);
    CHECK(r.to_vector<float>() == std::vector<float>{3.5f, 4.5f, 9.5f});
  }
  SECTION("int32 tensor + float64 0-dim tensor -> float64") {
    CHECK(gw::result_type(i32, f64_0d) == gw::kFloat64);
    Tensor r = i32 + f64_0d;
    CHECK(r.dtype() == gw::kFloat64);
    CHECK(r.to_vector<double>() == std::vector<double>{3.5, 4.5, 9.5});
  }
  SECTION("bool tensor + 1 -> int64") {
    CHECK(gw::result_type(b, 1) == gw::kInt64);
    Tensor r = b + 1;
    CHECK(r.dtype() == gw::kInt64);
    CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{2, 1, 2});
  }
  SECTION("float32 tensor + float64 0-dim tensor -> float32") {
    CHECK(gw::result_type(f32, f64_0d) == gw::kFloat32);
    CHECK((f32 + f64_0d).dtype() == gw::kFloat32);
    CHECK((f64_0d * f32).dtype() == gw::kFloat32);
  }
  SECTION("a 0-dim or scalar integer never widens an integer tensor") {
    CHECK(gw::result_type(i32, i64_0d) == gw::kInt32);
    CHECK((i32 + i64_0d).dtype() == gw::kInt32);
    CHECK((i32 * 2).dtype() == gw::kInt32);
    CHECK((i64 * 2).dtype() == gw::kInt64);
    CHECK(gw::result_type(b, i64_0d) == gw::kInt64);  // but lifts bool to integer
  }
  SECTION("between 0-dim tensors the ordinary promotion applies") {
    Tensor i32_0d = gw::scalar_tensor(1, gw::kInt32);
    CHECK(gw::result_type(i32_0d, i64_0d) == gw::kInt64);
    CHECK((i32_0d + 2.5).dtype() == gw::kFloat32);
    CHECK((f64_0d + 2.5).dtype() == gw::kFloat64);
    CHECK((i32_0d + i64_0d).dim() == 0);
  }
  SECTION("mixed dimensioned tensors") {
    CHECK((f32 + i64).dtype() == gw::kFloat32);
    CHECK((f32 * f64).dtype() == gw::kFloat64);
    CHECK((b * i32).dtype() == gw::kInt32);
    CHECK((f64 + 1).dtype() == gw::kFloat64);
  }
  SECTION("integer division is true division in float32") {
    Tensor r = i32 / gw::from_vector<int32_t>({2, 4, 2});
    CHECK(r.dtype() == gw::kFloat32);
    CHECK(r.to_vector<float>() == std::vector<float>{0.5f, 0.5f, 3.5f});
    CHECK((i64 / 2).dtype() == gw::kFloat32);
    CHECK((i64 / 2).to_vector<float>() == std::vector<float>{1.5f, 2.f, 1.f});
    CHECK((f64 / 2).dtype() == gw::kFloat64);
    CHECK((1 / i64).to_vector<float>() == std::vector<float>{1.f / 3, 0.25f, 0.5f});
  }
  SECTION("bool with bool: add is or, mul is and") {
    Tensor c = gw::from_vector<bool>({true, true, false});
    CHECK((b + c).dtype() == gw::kBool);
    CHECK((b + c).to_vector<bool>() == std::vector<bool>{true, true, true});
    CHECK((b * c).to_vector<bool>() == std::vector<bool>{true, false, false});
  }
  SECTION("comparisons give bool whatever the inputs") {
    CHECK(gw::lt(i32, f64).dtype() == gw::kBool);
    CHECK(gw::eq(i64, 2).dtype() == gw::kBool);
    CHECK(gw::gt(f32, f64_0d).dtype() == gw::kBool);
  }
  SECTION("promote_types") {
    CHECK(gw::promote_types(gw::kBool, gw::kInt32) == gw::kInt32);
    CHECK(gw::promote_types(gw::kInt64, gw::kFloat32) == gw::kFloat32);
    CHECK(gw::promote_types(gw::kFloat16, gw::kBFloat16) == gw::kFloat32);
    CHECK(gw::promote_types(gw::kFloat64, gw::kInt32) == gw::kFloat64);
    CHECK(gw::promote_types(gw::kInt32, gw::kInt32) == gw::kInt32);
  }
}

// --- strided inputs -------------------------------------------------------------------------

TEST_CASE("binary ops read transposed, stepped and expanded inputs correctly",
          "[core][elementwise]") {
  std::vector<double> va = sample(12, 5), vb = sample(24, 6);
  Tensor a = gw::from_vector(va, {3, 4});
  Tensor b = gw::from_vector(vb, {4, 6});
  Tensor at = a.t();                      // (4,3), a[j][i]
  Tensor bs = b.slice(1, 1, 6, 2);        // (4,3), b[i][1 + 2j]
  Tensor col = gw::from_vector(sample(4, 7), {4, 1});
  Tensor ce = col.expand({4, 3});         // stride 0 along dim 1
  std::vector<double> vc = sample(4, 7);
  std::vector<double> want_sum, want_prod;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      double x = va[j * 4 + i], y = vb[i * 6 + 1 + 2 * j], z = vc[i];
      want_sum.push_back(x + y - z);
      want_prod.push_back(x * y * z);
    }
  }
  Tensor s = gw::sub(gw::add(at, bs), ce);
  CHECK(s.sizes() == Shape{4, 3});
  check_close(s.to_vector<double>(), want_sum, 1e-12);
  check_close((at * bs * ce).to_vector<double>(), want_prod, 1e-12);
  // Same answer as on contiguous copies, including float32.
  CHECK(gw::equal(gw::maximum(at, bs), gw::maximum(at.contiguous(), bs.contiguous())));
  Tensor af = at.to(gw::kFloat32), bf = bs.to(gw::kFloat32);
  CHECK(gw::equal(af / bf, af.contiguous() / bf.contiguous()));
}

TEST_CASE("large strided elementwise ops match their contiguous counterpart",
          "[core][elementwise]") {
  // Big enough to take the multi-row paths of the strided iterator.
  std::vector<float> v(300 * 200);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) * 0.01f - 0.4f;
  Tensor m = gw::from_vector(v, {300, 200});
  Tensor t = m.t();
  Tensor r = gw::exp(t) + t.slice(0, 0, 200, 1) * 2.f;
  std::vector<float> got = r.to_vector<float>();
  for (int64_t i = 0; i < 200; i += 7) {
    for (int64_t j = 0; j < 300; j += 11) {
      float x = v[j * 200 + i];
      CHECK(got[i * 300 + j] == Approx(std::exp(x) + x * 2.f).epsilon(1e-6));
    }
  }
}

// --- operators ------------------------------------------------------------------------------

TEST_CASE("operators forward to the named ops", "[core][elementwise]") {
  std::vector<double> va{1.5, -2.0, 4.0}, vb{0.5, 4.0, -8.0};
  Tensor a = gw::from_vector(va), b = gw::from_vector(vb);
  auto each = [&](auto f) {
    std::vector<double> r;
    for (size_t i = 0; i < va.size(); ++i) r.push_back(f(va[i], vb[i]));
    return r;
  };
  CHECK((a + b).to_vector<double>() == each([](double x, double y) { return x + y; }));
  CHECK((a - b).to_vector<double>() == each([](double x, double y) { return x - y; }));
  CHECK((a * b).to_vector<double>() == each([](double x, double y) { return x * y; }));
  CHECK((a / b).to_vector<double>() == each([](double x, double y) { return x / y; }));
  CHECK((a + 2).to_vector<double>() == each([](double x, double) { return x + 2; }));
  CHECK((2 + a).to_vector<double>() == each([](double x, double) { return 2 + x; }));
  CHECK((a - 2).to_vector<double>() == each([](double x, double) { return x - 2; }));
  CHECK((2 - a).to_vector<double>() == each([](double x, double) { return 2 - x; }));
  CHECK((a * 3).to_vector<double>() == each([](double x, double) { return x * 3; }));
  CHECK((3 * a).to_vector<double>() == each([](double x, double) { return 3 * x; }));
  CHECK((a / 4).to_vector<double>() == each([](double x, double) { return x / 4; }));
  CHECK((4 / a).to_vector<double>() == each([](double x, double) { return 4 / x; }));
  CHECK((-a).to_vector<double>() == each([](double x, double) { return -x; }));
  CHECK((2.5 - gw::from_vector<int64_t>({1, 2})).to_vector<float>() ==
        std::vector<float>{1.5f, 0.5f});
  CHECK((7 - gw::from_vector<int64_t>({1, 2})).dtype() == gw::kInt64);

  Tensor c = a.clone();
  c += b;
  c -= 1;
  c *= b;
  c /= 2;
  CHECK(c.to_vector<double>() == each([](double x, double y) { return (x + y - 1) * y / 2; }));
  Tensor d = a.clone();
  d -= b;
  d *= 2;
  d += 1;
  d /= b;
  CHECK(d.to_vector<double>() == each([](double x, double y) { return ((x - y) * 2 + 1) / y; }));
  CHECK(a.to_vector<double>() == va);  // operators never touch their inputs
}

TEST_CASE("add_out and mul_out write into the given tensor", "[core][elementwise]") {
  Tensor a = gw::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = gw::from_vector<float>({10, 20, 30}, {3});
  Tensor out = gw::zeros({2, 3});
  uint64_t v0 = out.storage()->version();
  Tensor& r = gw::add_out(out, a, b);
  CHECK(&r == &out);
  CHECK(out.storage()->version() > v0);
  CHECK(out.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  gw::mul_out(out, a, b);
  CHECK(out.to_vector<float>() == std::vector<float>{10, 40, 90, 40, 100, 180});
  Tensor strided = gw::zeros({3, 2}).t();
  gw::add_out(strided, a, a);
  CHECK(strided.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
}

TEST_CASE("binary ops on outputs large enough to be streamed, at every alignment",
          "[core][elementwise]") {
  // Past 8 MiB a contiguous output is written with streaming stores: plain stores up to the
  // first 64-byte line, whole lines, then plain stores again. Offsets of 0..15 floats move
  // where those seams fall.
  const int64_t n = (int64_t{9} << 20) / 4 + 13;
  Tensor a = gw::arange(n + 16, gw::kFloat32), b = gw::arange(n + 16, gw::kFloat32) * 0.5;
  Tensor out = gw::zeros({n + 16});
  for (int64_t offset : {0, 1, 7, 15}) {
    INFO("offset " << offset);
    Tensor x = a.narrow(0, offset, n), y = b.narrow(0, 16 - offset, n);
    Tensor dst = out.narrow(0, offset, n);
    gw::add_out(dst, x, y);
    const auto got = dst.to_vector<float>();
    const auto xs = x.to_vector<float>(), ys = y.to_vector<float>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != xs[i] + ys[i];
    CHECK(wrong == 0);
  }
  // Float64 outputs, and in place (the output is an input: not streamed).
  Tensor d = gw::arange(n, gw::kFloat64), e = gw::arange(n, gw::kFloat64) * 3.0;
  Tensor sum = d + e;
  d.add_(e);
  CHECK(gw::equal(d, sum));
  CHECK(gw::equal(sum, gw::arange(n, gw::kFloat64) * 4.0));
}

TEST_CASE("a full CPU block cache makes room for the block given back", "[core]") {
  gw::empty_cpu_cache();
  gw::set_cpu_cache_limit(size_t{8} << 20);
  {
    Tensor big = gw::empty({int64_t{6} << 20 >> 2});  // 6 MiB: cached when freed
  }
  CHECK(gw::cpu_cached_bytes() == size_t{6} << 20);
  {
    Tensor small = gw::empty({int64_t{4} << 20 >> 2});  // 4 MiB: over the limit with the 6
  }
  CHECK(gw::cpu_cached_bytes() == size_t{4} << 20);  // the 6 MiB block made room
  {
    Tensor huge = gw::empty({int64_t{16} << 20 >> 2});  // larger than the limit: not kept
  }
  CHECK(gw::cpu_cached_bytes() == size_t{4} << 20);
  gw::set_cpu_cache_limit(size_t{256} << 20);
  gw::empty_cpu_cache();
}

TEST_CASE("the CPU allocator counts the bytes in use and their peak", "[core]") {
  const size_t mib = size_t{1} << 20;
  const size_t before = gw::cpu_memory_stats().allocated_bytes;
  gw::reset_peak_cpu_memory_stats();
  CHECK(gw::cpu_memory_stats().peak_allocated_bytes == before);
  {
    Tensor a = gw::empty({int64_t{3} << 20 >> 2});  // 3 MiB
    CHECK(gw::cpu_memory_stats().allocated_bytes == before + 3 * mib);
    {
      Tensor b = gw::empty({int64_t{1} << 20 >> 2});
      CHECK(gw::cpu_memory_stats().allocated_bytes == before + 4 * mib);
    }
    CHECK(gw::cpu_memory_stats().allocated_bytes == before + 3 * mib);
    const size_t cached = gw::cpu_memory_stats().cached_bytes;  // b's block, kept
    Tensor again = gw::empty({int64_t{1} << 20 >> 2});          // from the cache
    CHECK(gw::cpu_memory_stats().cached_bytes == cached - mib);
    CHECK(gw::cpu_memory_stats().allocated_bytes == before + 4 * mib);
  }
  const gw::CpuMemoryStats after = gw::cpu_memory_stats();
  CHECK(after.allocated_bytes == before);
  CHECK(after.peak_allocated_bytes == before + 4 * mib);
  gw::reset_peak_cpu_memory_stats();
  CHECK(gw::cpu_memory_stats().peak_allocated_bytes == before);
}

TEST_CASE("memory_stats(device) is the CPU allocator's counters on the CPU", "[core]") {
  const size_t mib = size_t{1} << 20;
  gw::reset_peak_memory_stats(gw::kCPU);
  const gw::MemoryStats before = gw::memory_stats(gw::kCPU);
  CHECK(before.allocated_bytes == gw::cpu_memory_stats().allocated_bytes);
  CHECK(before.peak_allocated_bytes == before.allocated_bytes);
  CHECK(before.reserved_bytes == before.allocated_bytes + gw::cpu_memory_stats().cached_bytes);
  {
    Tensor a = gw::empty({int64_t{2} << 20 >> 2});  // 2 MiB
    CHECK(gw::memory_stats().allocated_bytes == before.allocated_bytes + 2 * mib);
  }
  CHECK(gw::memory_stats(gw::kCPU).peak_allocated_bytes == before.allocated_bytes + 2 * mib);
  gw::reset_peak_memory_stats();
  CHECK(gw::memory_stats().peak_allocated_bytes == before.allocated_bytes);
}
