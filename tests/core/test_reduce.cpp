// Reductions (core/ops/reduce.h) against a reference that groups the input elements by output
// position in plain C++: every dims/keepdim combination on contiguous and strided inputs, result
// dtypes, ties, -inf handling in logsumexp/softmax and float accuracy on a large sum.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_util.h"

using gw::Shape;
using gw::Tensor;

using core_test::kInf;

namespace {

// Deterministic values with a wide spread and no ties.
std::vector<double> spread(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<double>(i) * 1.7 + 0.3) * 3.0;
  return v;
}

std::vector<int64_t> normalize(const std::vector<int64_t>& dims, int64_t ndim) {
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(d < 0 ? d + ndim : d);
  if (dims.empty())
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
  return out;
}

struct Grouped {
  Shape shape;                             // output shape for the requested keepdim
  std::vector<std::vector<double>> groups;  // input elements per output position
};

// Splits the elements of x (read in logical row-major order) by output position of a
// reduction over `dims` (empty: all dims).
Grouped group_by_output(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const Shape& s = x.sizes();
  const int64_t nd = x.dim();
  std::vector<int64_t> dims = normalize(dims_in, nd);
  std::vector<bool> reduced(nd, false);
  for (int64_t d : dims) reduced[d] = true;
  Grouped g;
  Shape kept;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) kept.push_back(s[d]);
    if (!reduced[d] || keepdim) g.shape.push_back(reduced[d] ? 1 : s[d]);
  }
  g.groups.resize(static_cast<size_t>(gw::numel(kept)));
  std::vector<double> data = x.to_vector<double>();
  std::vector<int64_t> idx(nd, 0);
  for (double v : data) {
    int64_t out = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!reduced[d]) out = out * s[d] + idx[d];
    g.groups[out].push_back(v);
    for (int64_t d = nd; d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  return g;
}

double ref_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double ref_mean(const std::vector<double>& v) { return ref_sum(v) / static_cast<double>(v.size()); }
double ref_prod(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}
double ref_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double ref_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double ref_var(const std::vector<double>& v, int64_t correction) {
  double m = ref_mean(v), ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return ss / static_cast<double>(static_cast<int64_t>(v.size()) - correction);
}
double ref_logsumexp(const std::vector<double>& v) {
  double m = ref_max(v);
  if (std::isinf(m)) m = 0;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

void check_values(const std::vector<double>& got, const std::vector<double>& want, double eps) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    if (std::isinf(want[i]) || std::isnan(want[i])) {
      CHECK((got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))));
    } else {
      CHECK(got[i] == Approx(want[i]).epsilon(eps).margin(eps));
    }
  }
}

// The inputs every reduction is run on: contiguous, transposed and stepped views of one base.
std::vector<std::pair<std::string, Tensor>> inputs() {
  Tensor base = gw::from_vector(spread(48), {2, 3, 8});
  return {
      {"contiguous", base.slice(2, 0, 4)},           // (2,3,4)
      {"transposed", base.slice(2, 0, 4).transpose(0, 2)},  // (4,3,2)
      {"stepped", base.slice(2, 1, 8, 2)},          // (2,3,4), stride 2
      {"permuted", base.permute({1, 2, 0}).slice(1, 0, 8, 3)},  // (3,3,2)
  };
}

const std::vector<std::vector<int64_t>> kDimLists{{},     {0},     {1},       {2},    {-1},
                                                  {0, 2}, {-1, -3}, {2, 0}, {0, 1, 2}, {1, -1}};

using Reduction = std::function<Tensor(const Tensor&, const Shape&, bool)>;
using RefReduction = std::function<double(const std::vector<double>&)>;

void check_reduction(const std::string& name, const Reduction& op, const RefReduction& ref) {
  for (const auto& [label, x] : inputs()) {
    for (const auto& dims : kDimLists) {
      for (bool keepdim : {false, true}) {
        CAPTURE(name, label, gw::shape_str(dims), keepdim);
        Grouped g = group_by_output(x, dims, keepdim);
        Tensor r = op(x, dims, keepdim);
        CHECK(r.sizes() == g.shape);
        CHECK(r.dtype() == x.dtype());
        std::vector<double> want;
        for (const auto& grp : g.groups) want.push_back(ref(grp));
        check_values(r.to_vector<double>(), want, 1e-12);
      }
    }
  }
}

}  // namespace

// --- values over dims -----------------------------------------------------------------------

TEST_CASE("sum over every dims/keepdim combination", "[core][reduce]") {
  check_reduction("sum", [](const Tensor& x, const Shape& d, bool k) { return gw::sum(x, d, k); },
                  ref_sum);
  for (const auto& [label, x] : inputs()) {
    CAPTURE(label);
    Tensor all = gw::sum(x);
    CHECK(all.dim() == 0);
    CHECK(all.item<double>() == Approx(ref_sum(x.to_vector<double>())).epsilon(1e-12));
    CHECK(x.sum().item<double>() == all.item<double>());
  }
}

TEST_CASE("mean over every dims/keepdim combination", "[core][reduce]") {
  check_reduction("mean",
                  [](const Tensor& x, const Shape& d, bool k) { return gw::mean(x, d, k); },
                  ref_mean);
  Tensor x = inputs()[1].second;
  CHECK(gw::mean(x).item<double>() == Approx(ref_mean(x.to_vector<double>())).epsilon(1e-12));
  CHECK(x.mean({0}, true).sizes() == Shape{1, 3, 2});
}

TEST_CASE("prod over every dims/keepdim combination", "[core][reduce]") {
  check_reduction("prod",
                  [](const Tensor& x, const Shape& d, bool k) { return gw::prod(x, d, k); },
                  ref_prod);
  Tensor x = inputs()[2].second;
  CHECK(gw::prod(x).item<double>() == Approx(ref_prod(x.to_vector<double>())).epsilon(1e-12));
}

TEST_CASE("amax and amin over every dims/keepdim combination", "[core][reduce]") {
  check_reduction("amax",
                  [](const Tensor& x, const Shape& d, bool k) { return gw::amax(x, d, k); },
                  ref_max);
  check_reduction("amin",
                  [](const Tensor& x, const Shape& d, bool k) { return gw::amin(x, d, k); },
                  ref_min);
  for (const auto& [label, x] : inputs()) {
    CAPTURE(label);
    std::vector<double> v = x.to_vector<double>();
    CHECK(gw::max(x).item<double>() == ref_max(v));
    CHECK(gw::min(x).item<double>() == ref_min(v));
    CHECK(x.max().dim() == 0);
    CHECK(x.min().item<double>() == ref_min(v));
  }
}

TEST_CASE("var and std with both corrections", "[core][reduce]") {
  for (int64_t correction : {1, 0}) {
    check_reduction(
        "var",
        [correction](const Tensor& x, const Shape& d, bool k) { return gw::var(x, d, correction, k); },
        [correction](const std::vector<double>& v) { return ref_var(v, correction); });
    check_reduction(
        "std",
        [correction](const Tensor& x, const Shape& d, bool k) { return gw::std(x, d, correction, k); },
        [correction](const std::vector<double>& v) { return std::sqrt(ref_var(v, correction)); });
  }
  Tensor x = inputs()[0].second;
  std::vector<double> v = x.to_vector<double>();
  CHECK(gw::var(x).item<double>() == Approx(ref_var(v, 1)).epsilon(1e-12));
  CHECK(gw::var(x, {}, 0).item<double>() == Approx(ref_var(v, 0)).epsilon(1e-12));
  CHECK(gw::std(x).item<double>() == Approx(std::sqrt(ref_var(v, 1))).epsilon(1e-12));
  // One element with Bessel's correction: 0/0, NaN as in PyTorch.
  CHECK(std::isnan(gw::var(gw::from_vector<double>({3.0})).item<double>()));
  CHECK(gw::var(gw::from_vector<double>({3.0}), {}, 0).item<double>() == 0.0);
}

TEST_CASE("logsumexp over every dims/keepdim combination", "[core][reduce]") {
  check_reduction(
      "logsumexp",
      [](const Tensor& x, const Shape& d, bool k) { return gw::logsumexp(x, d, k); },
      ref_logsumexp);
}

TEST_CASE("logsumexp handles -inf rows and large values", "[core][reduce]") {
  Tensor x = gw::from_vector<double>({-kInf, -kInf, 0.0, -kInf, 1.0, 2.0, 1000.0, 1000.0}, {4, 2});
  std::vector<double> r = gw::logsumexp(x, {1}).to_vector<double>();
  REQUIRE(r.size() == 4);
  CHECK(r[0] == -kInf);  // every term is exp(-inf) = 0
  CHECK(r[1] == Approx(0.0).margin(1e-15));
  CHECK(r[2] == Approx(std::log(std::exp(1.0) + std::exp(2.0))).epsilon(1e-14));
  CHECK(r[3] == Approx(1000.0 + std::log(2.0)).epsilon(1e-14));  // no overflow
  Tensor pos = gw::logsumexp(gw::from_vector<double>({kInf, 0.0}), {0});
  CHECK(pos.item<double>() == kInf);
  Tensor f = gw::logsumexp(gw::from_vector<float>({100.f, 100.f}), {0});
  CHECK(f.dtype() == gw::kFloat32);
  CHECK(f.item<float>() == Approx(100.f + std::log(2.f)));
}

// --- dtypes ---------------------------------------------------------------------------------

TEST_CASE("result dtypes of reductions", "[core][reduce]") {
  Tensor i32 = gw::from_vector<int32_t>({2000000000, 2000000000, -5}, {3});
  Tensor s = gw::sum(i32);
  CHECK(s.dtype() == gw::kInt64);
  CHECK(s.item<int64_t>() == int64_t{4000000000} - 5);  // no int32 overflow
  CHECK(gw::sum(i32, {0}, true).dtype() == gw::kInt64);
  // int32 inputs accumulate in int64, also over dims and in products (as in PyTorch).
  Tensor col = gw::from_vector<int32_t>({2000000000, 2000000000}, {2, 1});
  CHECK(gw::sum(col, {0}).to_vector<int64_t>() == std::vector<int64_t>{4000000000});
  CHECK(gw::prod(gw::from_vector<int32_t>({100000, 100000})).item<int64_t>() == 10000000000);
  Tensor flags = gw::from_vector<bool>({true, false, true, true});
  CHECK(gw::sum(flags).dtype() == gw::kInt64);
  CHECK(gw::sum(flags).item<int64_t>() == 3);
  CHECK(gw::prod(gw::from_vector<int32_t>({3, -4, 5})).dtype() == gw::kInt64);
  CHECK(gw::prod(gw::from_vector<int32_t>({3, -4, 5})).item<int64_t>() == -60);
  CHECK(gw::sum(gw::from_vector<float>({1.f, 2.f})).dtype() == gw::kFloat32);
  CHECK(gw::sum(gw::from_vector<double>({1.0})).dtype() == gw::kFloat64);
  CHECK(gw::max(i32).dtype() == gw::kInt32);
  CHECK(gw::max(i32).item<int32_t>() == 2000000000);
  CHECK(gw::amin(i32, {0}).dtype() == gw::kInt32);
  CHECK(gw::amin(i32, {0}).item<int32_t>() == -5);
  CHECK(gw::argmax(i32).dtype() == gw::kInt64);
  CHECK(gw::mean(gw::from_vector<float>({1.f, 2.f})).dtype() == gw::kFloat32);
  auto mx = gw::max(gw::from_vector<int64_t>({1, 9, 3}, {1, 3}), 1);
  CHECK(mx.values.dtype() == gw::kInt64);
  CHECK(mx.indices.dtype() == gw::kInt64);
  CHECK(mx.values.to_vector<int64_t>() == std::vector<int64_t>{9});
  CHECK(mx.indices.to_vector<int64_t>() == std::vector<int64_t>{1});
}

TEST_CASE("integer sums over dims are exact", "[core][reduce]") {
  std::vector<int64_t> v(24);
  for (int64_t i = 0; i < 24; ++i) v[i] = (i * 7919) % 1000 - 500;
  Tensor x = gw::from_vector(v, {2, 3, 4}).transpose(1, 2);  // (2,4,3)
  Tensor r = gw::sum(x, {-1});
  CHECK(r.sizes() == Shape{2, 4});
  std::vector<int64_t> want;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) {
      int64_t s = 0;
      for (int j = 0; j < 3; ++j) s += v[i * 12 + j * 4 + k];
      want.push_back(s);
    }
  CHECK(r.to_vector<int64_t>() == want);
}

// --- extremes with indices ------------------------------------------------------------------

TEST_CASE("max/min/argmax/argmin along a dim, first index on ties", "[core][reduce]") {
  // Small integers in float: lots of ties.
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<double>((i * 7) % 5);
  Tensor base = gw::from_vector(v, {2, 3, 4});
  for (const Tensor& x : {base, base.transpose(0, 2), base.slice(2, 0, 4, 2)}) {
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      for (bool keepdim : {false, true}) {
        CAPTURE(gw::shape_str(x.sizes()), dim, keepdim);
        Grouped g = group_by_output(x, {dim}, keepdim);
        std::vector<double> want_max, want_min;
        std::vector<int64_t> want_argmax, want_argmin;
        for (const auto& grp : g.groups) {
          auto mx = std::max_element(grp.begin(), grp.end());  // first of equal maxima
          auto mn = std::min_element(grp.begin(), grp.end());
          want_max.push_back(*mx);
          want_min.push_back(*mn);
          want_argmax.push_back(mx - grp.begin());
          want_argmin.push_back(mn - grp.begin());
        }
        auto [vmax, imax] = gw::max(x, dim, keepdim);
        auto [vmin, imin] = gw::min(x, dim, keepdim);
        CHECK(vmax.sizes() == g.shape);
        CHECK(imax.sizes() == g.shape);
        CHECK(vmax.to_vector<double>() == want_max);
        CHECK(vmin.to_vector<double>() == want_min);
        CHECK(imax.to_vector<int64_t>() == want_argmax);
        CHECK(imin.to_vector<int64_t>() == want_argmin);
        CHECK(gw::argmax(x, dim, keepdim).to_vector<int64_t>() == want_argmax);
        CHECK(gw::argmin(x, dim, keepdim).to_vector<int64_t>() == want_argmin);
        CHECK(gw::argmax(x, dim, keepdim).sizes() == g.shape);
      }
    }
  }
}

TEST_CASE("argmax/argmin without a dim index the flattened tensor", "[core][reduce]") {
  Tensor x = gw::from_vector<float>({1, 7, 3, 7, -2, -2}, {2, 3});
  CHECK(gw::argmax(x).dim() == 0);
  CHECK(gw::argmax(x).item<int64_t>() == 1);  // first of the two 7s
  CHECK(gw::argmin(x).item<int64_t>() == 4);
  CHECK(x.argmax().item<int64_t>() == 1);
  // Of a transposed view, in the view's logical order: x.t() = [[1,7],[7,-2],[3,-2]].
  CHECK(gw::argmax(x.t()).item<int64_t>() == 1);
  CHECK(gw::argmin(x.t()).item<int64_t>() == 3);
  CHECK(x.argmax(1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(gw::argmax(gw::scalar_tensor(5.0)).item<int64_t>() == 0);
  auto [v, i] = gw::max(gw::scalar_tensor(5.0), 0);
  CHECK(v.item<double>() == 5.0);
  CHECK(i.item<int64_t>() == 0);
}

TEST_CASE("max and argmax pick NaN like PyTorch", "[core][reduce][nan]") {
  Tensor x = gw::from_vector<double>({1.0, std::nan(""), 3.0, std::nan("")});
  CHECK(std::isnan(gw::max(x).item<double>()));
  CHECK(std::isnan(gw::min(x).item<double>()));
  CHECK(gw::argmax(x).item<int64_t>() == 1);
  CHECK(gw::argmin(x).item<int64_t>() == 1);
  CHECK(std::isnan(gw::amax(x, {0}).item<double>()));
}

// --- edge shapes ----------------------------------------------------------------------------

TEST_CASE("reductions of 0-dim and empty tensors", "[core][reduce]") {
  Tensor s = gw::scalar_tensor(2.5, gw::kFloat64);
  CHECK(gw::sum(s).item<double>() == 2.5);
  CHECK(gw::sum(s).dim() == 0);
  CHECK(gw::mean(s).item<double>() == 2.5);
  CHECK(gw::max(s).item<double>() == 2.5);
  // A 0-dim tensor accepts dim 0 and -1, as in PyTorch (torch.tensor(2.5).mean(0) == 2.5).
  CHECK(gw::sum(s, {0}).item<double>() == 2.5);
  CHECK(gw::sum(s, {-1}).dim() == 0);
  CHECK(gw::amax(s, {0}).item<double>() == 2.5);
  CHECK(gw::mean(s, {0}).item<double>() == 2.5);
  CHECK(gw::logsumexp(s, {0}).item<double>() == Approx(2.5));

  Tensor e = gw::zeros({0});
  CHECK(gw::sum(e).item<float>() == 0.f);
  CHECK(gw::prod(e).item<float>() == 1.f);
  CHECK(std::isnan(gw::mean(e).item<float>()));  // 0/0, as in PyTorch
  Tensor m = gw::ones({2, 0});
  Tensor r = gw::sum(m, {1});
  CHECK(r.sizes() == Shape{2});
  CHECK(r.to_vector<float>() == std::vector<float>{0.f, 0.f});
  CHECK(gw::sum(m, {0}).sizes() == Shape{0});
  CHECK(gw::prod(m, {1}, true).to_vector<float>() == std::vector<float>{1.f, 1.f});
}

// --- softmax --------------------------------------------------------------------------------

TEST_CASE("softmax and log_softmax over each dim", "[core][reduce][softmax]") {
  Tensor base = gw::from_vector(spread(60), {3, 4, 5});
  for (const Tensor& x : {base, base.transpose(0, 2), base.slice(1, 0, 4, 3)}) {
    for (int64_t dim : {0, 1, 2, -1}) {
      CAPTURE(gw::shape_str(x.sizes()), dim);
      Tensor p = gw::softmax(x, dim), lp = gw::log_softmax(x, dim);
      CHECK(p.sizes() == x.sizes());
      CHECK(lp.sizes() == x.sizes());
      // Reference, one slice along `dim` at a time, via moving `dim` last.
      int64_t d = dim < 0 ? dim + 3 : dim;
      Shape perm;
      for (int64_t k = 0; k < 3; ++k)
        if (k != d) perm.push_back(k);
      perm.push_back(d);
      std::vector<double> xv = x.permute(perm).to_vector<double>();
      std::vector<double> pv = p.permute(perm).to_vector<double>();
      std::vector<double> lv = lp.permute(perm).to_vector<double>();
      const int64_t n = x.size(d);
      for (size_t row = 0; row * n < xv.size(); ++row) {
        std::vector<double> r(xv.begin() + row * n, xv.begin() + (row + 1) * n);
        double m = ref_max(r), z = 0;
        for (double v : r) z += std::exp(v - m);
        double total = 0;
        for (int64_t i = 0; i < n; ++i) {
          double want = std::exp(r[i] - m) / z;
          CHECK(pv[row * n + i] == Approx(want).epsilon(1e-12));
          CHECK(lv[row * n + i] == Approx(r[i] - m - std::log(z)).epsilon(1e-12));
          total += pv[row * n + i];
        }
        CHECK(total == Approx(1.0).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("softmax of large and -inf inputs stays finite", "[core][reduce][softmax]") {
  SECTION("float32 inputs far beyond exp's range") {
    Tensor x = gw::from_vector<float>({1000.f, 1001.f, 1002.f, -1000.f, -1001.f, -1002.f}, {2, 3});
    std::vector<float> p = gw::softmax(x, 1).to_vector<float>();
    std::vector<float> lp = gw::log_softmax(x, 1).to_vector<float>();
    double z = 1 + std::exp(1.0) + std::exp(2.0);  // shifted by the row max
    double want[3] = {1 / z, std::exp(1.0) / z, std::exp(2.0) / z};
    for (int i = 0; i < 3; ++i) {
      CHECK(p[i] == Approx(want[i]).epsilon(1e-5));
      CHECK(p[3 + i] == Approx(want[2 - i]).epsilon(1e-5));
      CHECK(lp[i] == Approx(std::log(want[i])).epsilon(1e-5));
    }
    for (float v : p) CHECK(std::isfinite(v));
  }
  SECTION("-inf entries get probability 0") {
    Tensor x = gw::from_vector<double>({-kInf, 0.0, std::log(3.0)}, {3});
    std::vector<double> p = gw::softmax(x, 0).to_vector<double>();
    CHECK(p[0] == 0.0);
    CHECK(p[1] == Approx(0.25));
    CHECK(p[2] == Approx(0.75));
    CHECK(gw::log_softmax(x, 0).to_vector<double>()[0] == -kInf);
  }
  SECTION("a 0-dim input is a one-element distribution") {
    CHECK(gw::softmax(gw::scalar_tensor(3.0), 0).item<float>() == 1.f);
    CHECK(gw::log_softmax(gw::scalar_tensor(3.0), 0).item<float>() == 0.f);
  }
  SECTION("method forms") {
    Tensor x = gw::from_vector<double>({1, 2, 3, 4}, {2, 2});
    CHECK(gw::equal(x.softmax(0), gw::softmax(x, 0)));
    CHECK(gw::equal(x.log_softmax(-1), gw::log_softmax(x, 1)));
  }
}

// --- accuracy -------------------------------------------------------------------------------

TEST_CASE("a float32 sum of 1e6 elements is accurate", "[core][reduce]") {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(1000000);
  for (float& x : v) x = dist(rng);
  double want = 0;
  for (float x : v) want += static_cast<double>(x);
  Tensor t = gw::from_vector(v, {1000, 1000});
  // Naive float accumulation is off by ~1e-4 relative here; the result must be the double sum
  // rounded to float.
  CHECK(gw::sum(t).item<double>() == Approx(want).epsilon(1e-6));
  CHECK(gw::sum(t.t()).item<double>() == Approx(want).epsilon(1e-6));
  CHECK(gw::mean(t).item<double>() == Approx(want / 1e6).epsilon(1e-6));
  CHECK(gw::sum(t.reshape({-1}), {0}).item<double>() == Approx(want).epsilon(1e-6));
  // Column sums over a strided view: each is a sum of 1000 floats, checked in double.
  std::vector<float> cols = gw::sum(t, {0}).to_vector<float>();
  for (int64_t j = 0; j < 1000; j += 97) {
    double c = 0;
    for (int64_t i = 0; i < 1000; ++i) c += v[i * 1000 + j];
    CHECK(cols[j] == Approx(c).epsilon(1e-6));
  }
}
