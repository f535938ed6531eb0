// Matrix products (core/ops/linalg.h) against a naive triple loop in double: float32 and
// float64, transposed and sliced operands, every matmul rank combination with batch
// broadcasting, and zero-size dims.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "core/cpu/sgemm.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "test_util.h"
#include "tests/skip.h"

using core_test::broadcast_ref;
using core_test::source_index;
using gw::Shape;
using gw::Tensor;

namespace {

// Normal random values from the standard library (independent of gradwire's generator).
Tensor rnd(Shape shape, gw::DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist;
  std::vector<double> v(static_cast<size_t>(gw::numel(shape)));
  for (double& x : v) x = dist(rng);
  return core_test::make(v, shape, dtype);
}

// torch.matmul semantics written out: 1-D operands become a row / a column, batch dims
// broadcast, and the added dims are dropped from the result. Inputs are read in logical order.
std::vector<double> ref_matmul(const Tensor& ta, const Tensor& tb, Shape* out_shape) {
  Shape sa = ta.sizes(), sb = tb.sizes();
  std::vector<double> a = ta.to_vector<double>(), b = tb.to_vector<double>();
  bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
  REQUIRE(sb[sb.size() - 2] == k);
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_ref(ba, bb);
  std::vector<double> out;
  std::vector<int64_t> idx(batch.size(), 0);
  for (int64_t i = 0; i < gw::numel(batch); ++i) {
    const double* pa = a.data() + source_index(ba, idx) * n * k;
    const double* pb = b.data() + source_index(bb, idx) * k * m;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < m; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j) s += pa[r * k + j] * pb[j * m + c];
        out.push_back(s);
      }
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  *out_shape = batch;
  if (!a_vec) out_shape->push_back(n);
  if (!b_vec) out_shape->push_back(m);
  return out;
}

double tolerance(gw::DType dtype) { return dtype == gw::kFloat32 ? 1e-5 : 1e-12; }

// result == a @ b (torch.matmul semantics), in shape and values.
void check_product(const Tensor& result, const Tensor& a, const Tensor& b) {
  Shape want_shape;
  std::vector<double> want = ref_matmul(a, b, &want_shape);
  CHECK(result.sizes() == want_shape);
  CHECK(result.dtype() == a.dtype());
  std::vector<double> got = result.to_vector<double>();
  REQUIRE(got.size() == want.size());
  const double eps = tolerance(a.dtype());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == Approx(want[i]).epsilon(eps * 10).margin(eps * 10));
  }
}

const gw::DType kTypes[] = {gw::kFloat32, gw::kFloat64};

}  // namespace

TEST_CASE("mm matches a naive triple loop", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor a = rnd({5, 7}, dt, 1), b = rnd({7, 3}, dt, 2);
    check_product(gw::mm(a, b), a, b);
    Tensor big_a = rnd({33, 65}, dt, 3), big_b = rnd({65, 17}, dt, 4);
    check_product(gw::mm(big_a, big_b), big_a, big_b);
    Tensor v = rnd({1, 4}, dt, 5), w = rnd({4, 1}, dt, 6);
    check_product(gw::mm(v, w), v, w);
    check_product(gw::mm(w, v), w, v);
  }
}

TEST_CASE("mm reads transposed and sliced operands in place", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor at = rnd({7, 5}, dt, 1).t();                    // column-major (5,7)
    Tensor bt = rnd({3, 7}, dt, 2).t();                    // column-major (7,3)
    Tensor a_cols = rnd({5, 10}, dt, 3).narrow(1, 2, 7);  // row stride 10
    Tensor a_step = rnd({5, 14}, dt, 4).slice(1, 0, 14, 2);  // column stride 2
    Tensor b_step = rnd({14, 3}, dt, 5).slice(0, 1, 14, 2);  // row stride 6
    Tensor b_both = rnd({7, 6}, dt, 6).slice(1, 0, 6, 2);    // column stride 2
    Tensor b_rev = rnd({9, 7}, dt, 7).t().slice(1, 2, 9, 3);  // (7,3), column-major, ld 21
    Tensor b_odd = rnd({14, 9}, dt, 8).slice(0, 0, 14, 2).slice(1, 0, 9, 3);  // no unit stride
    for (const Tensor& a : {at, a_cols, a_step}) {
      for (const Tensor& b : {bt, b_step, b_both, b_rev, b_odd}) {
        CAPTURE(gw::shape_str(a.strides()), gw::shape_str(b.strides()));
        check_product(gw::mm(a, b), a, b);
      }
    }
  }
}

TEST_CASE("mm of integer matrices is exact", "[core][linalg]") {
  Tensor a = gw::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = gw::from_vector<int64_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor r = gw::mm(a, b);
  CHECK(r.dtype() == gw::kInt64);
  CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{58, 64, 139, 154});
  Tensor i32 = gw::mm(a.to(gw::kInt32).t(), a.to(gw::kInt32));
  CHECK(i32.dtype() == gw::kInt32);
  CHECK(i32.to_vector<int32_t>() == std::vector<int32_t>{17, 22, 27, 22, 29, 36, 27, 36, 45});
}

TEST_CASE("bmm multiplies matching batches", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor a = rnd({4, 5, 6}, dt, 1), b = rnd({4, 6, 3}, dt, 2);
    check_product(gw::bmm(a, b), a, b);
    Tensor at = rnd({4, 6, 5}, dt, 3).transpose(1, 2);
    Tensor bp = rnd({3, 6, 4}, dt, 4).permute({2, 1, 0});  // (4,6,3), no unit stride
    Tensor be = rnd({1, 6, 3}, dt, 5).expand({4, 6, 3});    // batch stride 0
    Tensor bs = rnd({8, 6, 3}, dt, 6).slice(0, 0, 8, 2);    // every other batch
    for (const Tensor& x : {a, at}) {
      for (const Tensor& y : {b, bp, be, bs}) {
        CAPTURE(gw::shape_str(x.strides()), gw::shape_str(y.strides()));
        check_product(gw::bmm(x, y), x, y);
      }
    }
  }
}

TEST_CASE("matmul covers every rank combination", "[core][linalg]") {
  const std::vector<std::pair<Shape, Shape>> cases{
      {{4}, {4}},                // dot
      {{4}, {4, 3}},             // vector @ matrix
      {{5, 4}, {4}},             // matrix @ vector
      {{5, 4}, {4, 3}},          // matrix @ matrix
      {{2, 5, 4}, {4, 3}},       // batch @ matrix (folded into one GEMM)
      {{2, 5, 4}, {4}},          // batch @ vector
      {{4}, {2, 4, 3}},          // vector @ batch
      {{5, 4}, {2, 4, 3}},       // matrix @ batch
      {{2, 5, 4}, {2, 4, 3}},    // batch @ batch
      {{2, 1, 3, 4}, {5, 4, 2}}, // broadcast batch dims
      {{3, 1, 2, 4}, {1, 4, 4, 3}},
      {{1, 5, 4}, {3, 4, 2}},
  };
  for (gw::DType dt : kTypes) {
    unsigned seed = 1;
    for (const auto& [sa, sb] : cases) {
      CAPTURE(dt, gw::shape_str(sa), gw::shape_str(sb));
      Tensor a = rnd(sa, dt, seed++), b = rnd(sb, dt, seed++);
      check_product(gw::matmul(a, b), a, b);
      check_product(a.matmul(b), a, b);
    }
  }
}

TEST_CASE("matmul with non-contiguous batched operands", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor a = rnd({5, 2, 4}, dt, 1).transpose(0, 1);  // (2,5,4), not contiguous
    Tensor b = rnd({4, 3}, dt, 2);
    check_product(gw::matmul(a, b), a, b);
    Tensor bt = rnd({3, 4}, dt, 3).t();
    check_product(gw::matmul(a, bt), a, bt);
    Tensor c = rnd({2, 4, 10}, dt, 4).slice(2, 0, 10, 2);  // (2,4,5) stepped
    Tensor d = rnd({2, 5, 3}, dt, 5).transpose(1, 2).transpose(1, 2);
    check_product(gw::matmul(c, d), c, d);
    Tensor e = rnd({3, 1, 4}, dt, 6).expand({3, 5, 4});  // rows repeated by stride 0
    check_product(gw::matmul(e, b), e, b);
  }
}

TEST_CASE("dot of 1-D tensors", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor a = rnd({9}, dt, 1), b = rnd({9}, dt, 2);
    Tensor r = gw::dot(a, b);
    CHECK(r.dim() == 0);
    check_product(r, a, b);
    Tensor s = rnd({18}, dt, 3).slice(0, 1, 18, 2);  // stride 2
    check_product(gw::dot(s, a), s, a);
  }
  CHECK(gw::dot(gw::from_vector<int64_t>({1, 2, 3}), gw::from_vector<int64_t>({4, 5, 6}))
            .item<int64_t>() == 32);
}

TEST_CASE("linear is x @ weight.T + bias", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    for (const Shape& xs : {Shape{3, 4}, Shape{2, 3, 4}, Shape{4}}) {
      CAPTURE(gw::shape_str(xs));
      Tensor x = rnd(xs, dt, 1), w = rnd({5, 4}, dt, 2), bias = rnd({5}, dt, 3);
      Tensor plain = gw::linear(x, w);
      check_product(plain, x, w.t());
      Tensor r = gw::linear(x, w, bias);
      CHECK(r.sizes() == plain.sizes());
      std::vector<double> p = plain.to_vector<double>(), got = r.to_vector<double>();
      std::vector<double> bv = bias.to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i)
        CHECK(got[i] == Approx(p[i] + bv[i % 5]).epsilon(tolerance(dt) * 10));
    }
  }
}

TEST_CASE("matrix products with zero-size dims", "[core][linalg]") {
  SECTION("empty rows or columns give empty results") {
    CHECK(gw::mm(gw::zeros({0, 3}), gw::zeros({3, 4})).sizes() == Shape{0, 4});
    CHECK(gw::mm(gw::zeros({3, 4}), gw::zeros({4, 0})).sizes() == Shape{3, 0});
    CHECK(gw::bmm(gw::zeros({0, 2, 3}), gw::zeros({0, 3, 4})).sizes() == Shape{0, 2, 4});
    CHECK(gw::matmul(gw::zeros({2, 0, 3}), gw::zeros({3, 4})).sizes() == Shape{2, 0, 4});
    CHECK(gw::matmul(gw::zeros({0, 3}), gw::zeros({3})).sizes() == Shape{0});
  }
  SECTION("an empty inner dim sums nothing: zeros") {
    Tensor r = gw::mm(gw::ones({3, 0}), gw::ones({0, 4}));
    CHECK(r.sizes() == Shape{3, 4});
    CHECK(gw::equal(r, gw::zeros({3, 4})));
    Tensor rb = gw::bmm(gw::ones({2, 3, 0}), gw::ones({2, 0, 4}));
    CHECK(gw::equal(rb, gw::zeros({2, 3, 4})));
    CHECK(gw::dot(gw::ones({0}), gw::ones({0})).item<float>() == 0.f);
    Tensor rm = gw::matmul(gw::ones({2, 3, 0}), gw::ones({0, 4}));
    CHECK(rm.sizes() == Shape{2, 3, 4});
    CHECK(gw::equal(rm, gw::zeros({2, 3, 4})));
  }
}

TEST_CASE("addmm is input + a @ b, the input broadcast", "[core][linalg]") {
  for (gw::DType dt : kTypes) {
    CAPTURE(dt);
    Tensor a = rnd({3, 4}, dt, 1), b = rnd({4, 5}, dt, 2);
    for (const Shape& is : {Shape{5}, Shape{1, 5}, Shape{3, 1}, Shape{3, 5}, Shape{}}) {
      CAPTURE(gw::shape_str(is));
      Tensor input = rnd(is, dt, 3);
      Tensor r = gw::addmm(input, a, b);
      Tensor want = gw::add(gw::mm(a, b), input);
      REQUIRE(r.sizes() == Shape{3, 5});
      std::vector<double> got = r.to_vector<double>(), w = want.to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i)
        CHECK(got[i] == Approx(w[i]).epsilon(tolerance(dt) * 10));
    }
  }
  // An empty inner dim: the input alone.
  CHECK(gw::equal(gw::addmm(gw::ones({4}), gw::ones({2, 0}), gw::ones({0, 4})), gw::ones({2, 4})));
  CHECK_THROWS_AS(gw::addmm(gw::ones({3}), gw::ones({2, 2}), gw::ones({2, 4})), gw::ShapeError);
  CHECK_THROWS_WITH(gw::addmm(gw::ones({3}), gw::ones({2, 2}), gw::ones({2, 4})),
                    Catch::Contains("addmm"));
  CHECK_THROWS_WITH(gw::addmm(gw::ones({4}), gw::ones({2, 3}), gw::ones({2, 4})),
                    Catch::Contains("[addmm] expects matrices (n,k) and (k,m), got shapes "
                                    "(2,3) and (2,4)"));
}

namespace {

// |got - a @ b| within float32's rounding of the sum of |a_ik b_kj|, element by element:
// an element read from the wrong place misses by about |a @ b| itself, far above that.
void check_float_product(const Tensor& got_t, const Tensor& a, const Tensor& b,
                         const Tensor& start = Tensor()) {
  const int64_t n = a.size(0), m = b.size(1);
  REQUIRE(got_t.sizes() == Shape{n, m});
  Shape shape;
  const std::vector<double> product = ref_matmul(a, b, &shape);
  const std::vector<double> magnitude = ref_matmul(gw::abs(a), gw::abs(b), &shape);  // Σ|a b|
  const std::vector<double> s = start.defined() ? start.expand({n, m}).to_vector<double>()
                                                : std::vector<double>(size_t(n * m), 0.0);
  const std::vector<double> got = got_t.to_vector<double>();
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = s[i] + product[i], bound = std::abs(s[i]) + magnitude[i];
    if (std::abs(got[i] - want) > 1e-5 * bound + 1e-30 && wrong++ < 5)
      FAIL_CHECK("(" << i / size_t(m) << ", " << i % size_t(m) << "): " << got[i]
                     << " != " << want);
  }
  CHECK(wrong == 0);
}

// The same (rows, cols) float32 matrix laid out as row-major, column-major (a transposed
// view) and with rows further apart than its width (a narrowed view).
std::vector<Tensor> layouts(int64_t rows, int64_t cols, unsigned seed) {
  return {rnd({rows, cols}, gw::kFloat32, seed), rnd({cols, rows}, gw::kFloat32, seed + 1).t(),
          rnd({rows, cols + 5}, gw::kFloat32, seed + 2).narrow(1, 3, cols)};
}

}  // namespace

TEST_CASE("float32 products of every shape the CPU GEMM tiles", "[core][linalg]") {
  // The AVX-512 GEMM (core/cpu/sgemm.h) works in tiles of 6 rows x 64 columns (4 vectors of 16,
  // the last panel's cut short), slices of 512 of k (its transposed B 16 at a time), 512 columns
  // and 384 rows of a packed A (copied 8 rows at a time when A is transposed, but for its last
  // rows): each shape below ends inside or just past one of those, in every layout of A and B.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 16, 1},    {5, 63, 15},  {6, 64, 16},   {7, 65, 17},   {14, 49, 16},
      {11, 31, 15},  {13, 33, 17}, {25, 77, 300}, {400, 40, 20}, {30, 1100, 20},
      {50, 64, 513}, {3, 20, 256}, {386, 100, 9}};
  for (auto [n, m, k] : shapes) {
    for (const Tensor& a : layouts(n, k, 10)) {
      for (const Tensor& b : layouts(k, m, 20)) {
        CAPTURE(n, m, k, gw::shape_str(a.strides()), gw::shape_str(b.strides()));
        check_float_product(gw::mm(a, b), a, b);
        const Tensor bias = rnd({m}, gw::kFloat32, 30), full = rnd({n, m}, gw::kFloat32, 31);
        check_float_product(gw::addmm(bias, a, b), a, b, bias);  // starts from the bias
        check_float_product(gw::addmm(full, a, b), a, b, full);  // adds to a copy of the input
      }
    }
  }
}

TEST_CASE("a product and its left operand's row sums in one pass", "[core][linalg]") {
  // detail::mm_and_row_sums, autograd's rule for a Linear's weight and bias gradients: dYᵀ X
  // and the column sums of dY. On AVX-512 the GEMM sums a transposed A's rows as it packs
  // them: the bits of mm and of sum(dY, {0}), for shapes past the GEMM's blocks (6-row tiles,
  // 16 k at a time, 512 k, 384 rows, 512 columns), on one thread and on two. Anything else
  // (A where it lies, fewer than 16 columns, float64, no AVX-512) is declined: nullopt.
  const std::vector<std::array<int64_t, 3>> shapes = {// A's rows, k, B's columns
                                                      {7, 5, 16},
                                                      {64, 17, 130},
                                                      {390, 600, 520},
                                                      {6, 1030, 20},
                                                      {13, 3, 8}};
  const int threads_before = gw::get_num_threads();
  for (int threads : {1, 2}) {
    gw::set_num_threads(threads);
    for (auto [n, k, m] : shapes) {
      const Tensor dy = rnd({k, n}, gw::kFloat32, 40), x = rnd({k, m}, gw::kFloat32, 41);
      CAPTURE(threads, n, k, m);
      const auto fused = gw::detail::mm_and_row_sums(dy.t(), x);
      REQUIRE(fused.has_value() == (gw::cpu::kHaveSgemm && m >= 16));
      if (fused) {
        CHECK(gw::equal(fused->first, gw::mm(dy.t(), x)));
        CHECK(gw::equal(fused->second, gw::sum(dy, {0})));
      }
      CHECK_FALSE(gw::detail::mm_and_row_sums(dy.t().contiguous(), x).has_value());
    }
  }
  gw::set_num_threads(threads_before);
  const Tensor a = rnd({30, 40}, gw::kFloat64, 42).t(), b = rnd({30, 20}, gw::kFloat64, 43);
  CHECK_FALSE(gw::detail::mm_and_row_sums(a, b).has_value());
  // Sums whose order shows: in double, k in order, a column of dY gives 1 (the 1 after 1e20
  // is lost, the last is not), where four running sums would give 0.
  if (gw::cpu::kHaveSgemm) {
    std::vector<double> v(8 * 16, 0.0);
    for (int64_t r = 0; r < 8; ++r)
      v[static_cast<size_t>(r * 16)] =
          std::array<double, 8>{1e20, 1, -1e20, 1, 0, 0, 0, 0}[static_cast<size_t>(r)];
    const Tensor dy = core_test::make(v, {8, 16}, gw::kFloat32);
    const auto fused = gw::detail::mm_and_row_sums(dy.t(), rnd({8, 16}, gw::kFloat32, 44));
    REQUIRE(fused.has_value());
    CHECK(fused->second.to_vector<float>()[0] == 1.0f);
    CHECK(gw::equal(fused->second, gw::sum(dy, {0})));
  }
}

TEST_CASE("a float32 product's row does not depend on the rows around it", "[core][linalg]") {
  if (!gw::cpu::kHaveSgemm)
    GW_SKIP("built without AVX-512: products go through Eigen, which does not promise this");
  // On AVX-512 builds, for products at least 16 columns wide (core/cpu/sgemm.h): a batch and
  // its micro-batches give the same bits. A read where it lies, and A packed (transposed).
  for (const Tensor& a : {rnd({29, 300}, gw::kFloat32, 1), rnd({300, 29}, gw::kFloat32, 4).t()}) {
    CAPTURE(gw::shape_str(a.strides()));
    const Tensor b = rnd({300, 70}, gw::kFloat32, 2), bias = rnd({70}, gw::kFloat32, 3);
    const Tensor whole = gw::mm(a, b), whole_bias = gw::addmm(bias, a, b);
    for (int64_t r : {0, 5, 6, 11, 12, 28}) {
      CAPTURE(r);
      CHECK(gw::equal(gw::mm(a.narrow(0, r, 1), b), whole.narrow(0, r, 1)));
      CHECK(gw::equal(gw::addmm(bias, a.narrow(0, r, 1), b), whole_bias.narrow(0, r, 1)));
    }
  }
}

TEST_CASE("a small batch against a transposed weight: the bits of the weight copied",
          "[core][linalg]") {
  if (!gw::cpu::kHaveSgemm)
    GW_SKIP("built without AVX-512: products go through Eigen, which does not promise this");
  // x @ w.T for a batch of 64 to 512 rows, few beside w's: the GEMM computes (w @ x.T).T, each
  // element from its bias and the same products, k in order (core/cpu/sgemm.h), on one thread
  // and on three. Shapes past its blocks: 512 of k, 512 of w's rows, 16 x 16 transposes, tiles
  // of 6.
  struct Threads {
    int before = gw::get_num_threads();
    ~Threads() { gw::set_num_threads(before); }
  } restore;
  const std::vector<std::array<int64_t, 3>> shapes = {// batch, in, out
                                                      {64, 784, 256},
                                                      {70, 600, 1030},
                                                      {100, 700, 300},
                                                      {512, 1000, 1100},
                                                      {63, 784, 256}};  // too few: as it was
  for (int threads : {1, 3}) {
    gw::set_num_threads(threads);
    for (auto [n, k, m] : shapes) {
      CAPTURE(threads, n, k, m);
      const Tensor x = rnd({n, k}, gw::kFloat32, 50), w = rnd({m, k}, gw::kFloat32, 51),
                   bias = rnd({m}, gw::kFloat32, 52);
      const Tensor copied = w.t().contiguous();
      CHECK(gw::equal(gw::mm(x, w.t()), gw::mm(x, copied)));
      const Tensor y = gw::addmm(bias, x, w.t());
      CHECK(gw::equal(y, gw::addmm(bias, x, copied)));
      check_float_product(y, x, w.t(), bias);
      // One row alone (too few to turn around) gives its row's bits.
      CHECK(gw::equal(gw::addmm(bias, x.narrow(0, n - 1, 1), w.t()), y.narrow(0, n - 1, 1)));
    }
  }
}

TEST_CASE("a float32 product split over CPU threads gives the same bits as on one",
          "[core][linalg]") {
  if (!gw::cpu::kHaveSgemm)
    GW_SKIP("built without AVX-512: products go through Eigen, on one thread");
  // The GEMM hands each thread a run of C's row tiles (core/cpu/sgemm.h): each row is summed in
  // the same order whatever thread takes it. Shapes large enough to split into 3 runs, the last
  // ending inside a tile; A where it lies and packed (transposed); from zero, the bias and C.
  struct Threads {  // the count this test found, whatever ends it
    int before = gw::get_num_threads();
    ~Threads() { gw::set_num_threads(before); }
  } restore;
  for (auto [n, m, k] : std::vector<std::array<int64_t, 3>>{{100, 70, 300}, {389, 64, 520}}) {
    for (const Tensor& a : layouts(n, k, 40)) {
      CAPTURE(n, m, k, gw::shape_str(a.strides()));
      const Tensor b = rnd({k, m}, gw::kFloat32, 41), bias = rnd({m}, gw::kFloat32, 42),
                   full = rnd({n, m}, gw::kFloat32, 43);
      gw::set_num_threads(1);
      const Tensor one = gw::mm(a, b), one_bias = gw::addmm(bias, a, b),
                   one_full = gw::addmm(full, a, b);
      gw::set_num_threads(3);
      CHECK(gw::equal(gw::mm(a, b), one));
      CHECK(gw::equal(gw::addmm(bias, a, b), one_bias));
      CHECK(gw::equal(gw::addmm(full, a, b), one_full));
      check_float_product(one, a, b);
    }
  }
}

TEST_CASE("batched float32 products wide enough for the CPU GEMM", "[core][linalg]") {
  // Each matrix of the batch at its own offset, and a batch broadcast (stride 0) on one side.
  const Tensor a = rnd({3, 20, 40}, gw::kFloat32, 1), b = rnd({3, 40, 33}, gw::kFloat32, 2);
  check_product(gw::bmm(a, b), a, b);
  const Tensor shared = rnd({40, 33}, gw::kFloat32, 3);
  check_product(gw::matmul(a.transpose(1, 2).contiguous().transpose(1, 2), shared), a, shared);
  check_product(gw::matmul(shared.t(), a.transpose(1, 2)), shared.t(), a.transpose(1, 2));
}
