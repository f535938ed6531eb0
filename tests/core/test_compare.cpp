// Comparisons, logic and selection (eq..ge, logical_*, where, masked_fill), allclose/equal,
// and the NaN behaviour of maximum/minimum/clamp (core/ops/elementwise.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_util.h"

using gw::Shape;
using gw::Tensor;

using core_test::kInf;
using core_test::kNaN;

// --- comparisons and logic ------------------------------------------------------------------

TEST_CASE("comparisons against tensors and scalars", "[core][elementwise]") {
  std::vector<double> va{1.0, 2.0, 3.0, kNaN}, vb{2.0, 2.0, 2.0, 2.0};
  Tensor a = gw::from_vector(va), b = gw::from_vector(vb);
  auto each = [&](auto f) {
    std::vector<bool> r;
    for (size_t i = 0; i < va.size(); ++i) r.push_back(f(va[i], vb[i]));
    return r;
  };
  CHECK(gw::eq(a, b).to_vector<bool>() == each(std::equal_to<double>()));
  CHECK(gw::ne(a, b).to_vector<bool>() == each(std::not_equal_to<double>()));
  CHECK(gw::lt(a, b).to_vector<bool>() == each(std::less<double>()));
  CHECK(gw::le(a, b).to_vector<bool>() == each(std::less_equal<double>()));
  CHECK(gw::gt(a, b).to_vector<bool>() == each(std::greater<double>()));
  CHECK(gw::ge(a, b).to_vector<bool>() == each(std::greater_equal<double>()));
  CHECK(gw::eq(a, 2).to_vector<bool>() == each(std::equal_to<double>()));
  CHECK(gw::ne(a, 2.0).to_vector<bool>() == each(std::not_equal_to<double>()));
  CHECK(gw::lt(a, 2).to_vector<bool>() == each(std::less<double>()));
  CHECK(gw::le(a, 2).to_vector<bool>() == each(std::less_equal<double>()));
  CHECK(gw::gt(a, 2).to_vector<bool>() == each(std::greater<double>()));
  CHECK(gw::ge(a, 2).to_vector<bool>() == each(std::greater_equal<double>()));
  CHECK(a.eq(b).to_vector<bool>() == each(std::equal_to<double>()));
  // An integer tensor against a fractional scalar compares in floating point.
  Tensor i = gw::from_vector<int64_t>({1, 2, 3});
  CHECK(gw::lt(i, 2.5).to_vector<bool>() == std::vector<bool>{true, true, false});
  CHECK(gw::eq(i, 2.5).to_vector<bool>() == std::vector<bool>{false, false, false});
  // Broadcasting
  Tensor g = gw::gt(gw::from_vector<float>({1, 2, 3}, {3, 1}), gw::from_vector<float>({2, 0}));
  CHECK(g.sizes() == Shape{3, 2});
  CHECK(g.to_vector<bool>() == std::vector<bool>{false, true, false, true, true, true});
}

TEST_CASE("logical_and and logical_or treat nonzero as true", "[core][elementwise]") {
  Tensor a = gw::from_vector<double>({0.0, 0.0, -1.5, 2.0});
  Tensor b = gw::from_vector<int64_t>({0, 3, 0, 7});
  Tensor land = gw::logical_and(a, b), lor = gw::logical_or(a, b);
  CHECK(land.dtype() == gw::kBool);
  CHECK(lor.dtype() == gw::kBool);
  CHECK(land.to_vector<bool>() == std::vector<bool>{false, false, false, true});
  CHECK(lor.to_vector<bool>() == std::vector<bool>{false, true, true, true});
  Tensor m = gw::logical_or(gw::from_vector<bool>({true, false}, {2, 1}),
                            gw::from_vector<bool>({false, false, true}));
  CHECK(m.sizes() == Shape{2, 3});
  CHECK(m.to_vector<bool>() == std::vector<bool>{true, true, true, false, false, true});
}

TEST_CASE("where selects with broadcasting and promotion", "[core][elementwise]") {
  Tensor cond = gw::from_vector<bool>({true, false, true}, {3, 1});
  Tensor a = gw::from_vector<float>({1, 2, 3, 4}, {1, 4});
  Tensor b = gw::scalar_tensor(-1.0, gw::kFloat32);
  Tensor r = gw::where(cond, a, b);
  CHECK(r.sizes() == Shape{3, 4});
  CHECK(r.dtype() == gw::kFloat32);
  CHECK(r.to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4, -1, -1, -1, -1, 1, 2, 3, 4});

  Tensor ints = gw::from_vector<int32_t>({5, 6, 7});
  Tensor flags = gw::from_vector<bool>({false, true, false});
  Tensor s = gw::where(flags, 1.5, ints);
  CHECK(s.dtype() == gw::kFloat32);
  CHECK(s.to_vector<float>() == std::vector<float>{5, 1.5f, 7});
  Tensor s2 = gw::where(flags, ints, 0);
  CHECK(s2.dtype() == gw::kInt32);
  CHECK(s2.to_vector<int32_t>() == std::vector<int32_t>{0, 6, 0});
  Tensor mixed = gw::where(flags, gw::from_vector<int64_t>({1, 2, 3}), gw::from_vector<double>({.5, .5, .5}));
  CHECK(mixed.dtype() == gw::kFloat64);
  CHECK(mixed.to_vector<double>() == std::vector<double>{.5, 2, .5});
}

TEST_CASE("masked_fill returns a filled copy", "[core][elementwise]") {
  Tensor x = gw::from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor mask = gw::from_vector<bool>({false, true});  // broadcast over rows
  Tensor r = gw::masked_fill(x, mask, -9.5);
  CHECK(r.dtype() == gw::kFloat64);
  CHECK(r.sizes() == Shape{2, 2});
  CHECK(r.to_vector<double>() == std::vector<double>{1, -9.5, 3, -9.5});
  CHECK(x.to_vector<double>() == std::vector<double>{1, 2, 3, 4});
  Tensor i = gw::masked_fill(gw::from_vector<int64_t>({1, 2}), gw::from_vector<bool>({true, false}), 7);
  CHECK(i.dtype() == gw::kInt64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{7, 2});
  Tensor neg_inf = gw::masked_fill(x, mask, -kInf);
  CHECK(neg_inf.to_vector<double>()[1] == -kInf);
}

// --- allclose / equal ------------------------------------------------------------------------

TEST_CASE("allclose uses atol + rtol * |b| and treats NaN as unequal", "[core][elementwise]") {
  Tensor a = gw::from_vector<double>({1.0, 100.0});
  CHECK(gw::allclose(a, a));
  CHECK(gw::allclose(a, gw::from_vector<double>({1.0 + 1e-9, 100.0 + 1e-4})));
  CHECK_FALSE(gw::allclose(a, gw::from_vector<double>({1.0 + 1e-4, 100.0})));
  CHECK(gw::allclose(a, gw::from_vector<double>({1.05, 100.0}), 0.1));
  CHECK(gw::allclose(a, gw::from_vector<double>({1.05, 100.0}), 0, 0.06));
  CHECK_FALSE(gw::allclose(a, gw::from_vector<double>({1.05, 100.0}), 0, 0.04));
  // rtol scales with |b|, not |a|
  CHECK(gw::allclose(gw::from_vector<double>({0.0}), gw::from_vector<double>({1.0}), 1.0, 0.0));
  CHECK_FALSE(gw::allclose(gw::from_vector<double>({1.0}), gw::from_vector<double>({0.0}), 1.0, 0.0));
  Tensor nan = gw::from_vector<double>({kNaN});
  CHECK_FALSE(gw::allclose(nan, nan));
  Tensor inf = gw::from_vector<double>({kInf, -kInf});
  CHECK(gw::allclose(inf, inf));
  CHECK_FALSE(gw::allclose(inf, gw::from_vector<double>({kInf, kInf})));  // -inf vs inf
  CHECK_FALSE(gw::allclose(gw::from_vector<double>({1.0}), gw::from_vector<double>({kInf})));
  // broadcasting and mixed dtypes
  CHECK(gw::allclose(gw::full({2, 3}, 2.0), gw::scalar_tensor(2.0)));
  CHECK(gw::allclose(gw::from_vector<int64_t>({1, 2}), gw::from_vector<float>({1.f, 2.f})));
}

TEST_CASE("equal needs the same shape and values", "[core][elementwise]") {
  Tensor a = gw::from_vector<float>({1, 2, 3, 4}, {2, 2});
  CHECK(gw::equal(a, a.clone()));
  CHECK(gw::equal(a, a.t().t()));
  CHECK_FALSE(gw::equal(a, a.t()));
  CHECK_FALSE(gw::equal(a, a.reshape({4})));
  CHECK_FALSE(gw::equal(a, a + 1e-3f));
  CHECK_FALSE(gw::equal(gw::from_vector<double>({kNaN}), gw::from_vector<double>({kNaN})));
  CHECK(gw::equal(gw::zeros({0, 3}), gw::zeros({0, 3})));
  CHECK_FALSE(gw::equal(gw::zeros({0, 3}), gw::zeros({3, 0})));
}

// --- NaN ------------------------------------------------------------------------------------

TEST_CASE("maximum and minimum propagate NaN from either side", "[core][elementwise][nan]") {
  Tensor a = gw::from_vector<double>({kNaN, 1.0, 3.0, kNaN});
  Tensor b = gw::from_vector<double>({1.0, kNaN, 2.0, kNaN});
  std::vector<double> mx = gw::maximum(a, b).to_vector<double>();
  std::vector<double> mn = gw::minimum(a, b).to_vector<double>();
  CHECK(std::isnan(mx[0]));
  CHECK(std::isnan(mx[1]));
  CHECK(mx[2] == 3.0);
  CHECK(std::isnan(mx[3]));
  CHECK(std::isnan(mn[0]));
  CHECK(std::isnan(mn[1]));
  CHECK(mn[2] == 2.0);
  CHECK(std::isnan(mn[3]));
  std::vector<float> mf = gw::maximum(gw::from_vector<float>({1.f, NAN}), gw::from_vector<float>({NAN, 0.f})).to_vector<float>();
  CHECK(std::isnan(mf[0]));
  CHECK(std::isnan(mf[1]));
}

TEST_CASE("clamp keeps NaN and applies each bound", "[core][elementwise][nan]") {
  Tensor x = gw::from_vector<double>({-5.0, -0.5, 0.5, 5.0, kNaN});
  std::vector<double> both = gw::clamp(x, -1.0, 1.0).to_vector<double>();
  CHECK(std::vector<double>(both.begin(), both.end() - 1) == std::vector<double>{-1, -0.5, 0.5, 1});
  CHECK(std::isnan(both.back()));
  std::vector<double> lo = gw::clamp(x, 0.0, std::nullopt).to_vector<double>();
  CHECK(lo[0] == 0.0);
  CHECK(lo[3] == 5.0);
  CHECK(std::isnan(lo[4]));
  std::vector<double> hi = gw::clamp(x, std::nullopt, 0.0).to_vector<double>();
  CHECK(hi[0] == -5.0);
  CHECK(hi[3] == 0.0);
  CHECK(std::isnan(hi[4]));
  // The missing bound does not turn infinities into finite extremes.
  Tensor inf = gw::from_vector<float>({-INFINITY, INFINITY});
  CHECK(gw::clamp(inf, std::nullopt, 0.0).to_vector<float>()[0] == -INFINITY);
  CHECK(gw::clamp(inf, 0.0, std::nullopt).to_vector<float>()[1] == INFINITY);
}

TEST_CASE("clamp promotes integers with fractional bounds", "[core][elementwise]") {
  Tensor i = gw::from_vector<int64_t>({-3, 0, 4});
  Tensor same = gw::clamp(i, 0, 2);
  CHECK(same.dtype() == gw::kInt64);
  CHECK(same.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 2});
  Tensor f = gw::clamp(i, 0.5, std::nullopt);
  CHECK(f.dtype() == gw::kFloat32);
  CHECK(f.to_vector<float>() == std::vector<float>{0.5f, 0.5f, 4.f});
}

TEST_CASE("clamp with min greater than max gives max everywhere", "[core][elementwise]") {
  // torch.clamp: "If min is greater than max, all elements are set to max".
  Tensor x = gw::from_vector<double>({-5.0, 2.0, 5.0});
  CHECK(gw::clamp(x, 3.0, 1.0).to_vector<double>() == std::vector<double>{1, 1, 1});
  Tensor i = gw::from_vector<int64_t>({0, 10});
  CHECK(gw::clamp(i, 7, 4).to_vector<int64_t>() == std::vector<int64_t>{4, 4});
}
