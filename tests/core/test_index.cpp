// Indexing and joining (core/ops/index.h, cat/stack/split/chunk in core/ops/shape_ops.h), each
// checked against loops over plain vectors.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "core/ops.h"

using gw::Shape;
using gw::Tensor;

namespace {

// A float32 (rows, cols) matrix with x[i][j] = 10 * i + j, built without gradwire ops.
Tensor grid(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(static_cast<float>(10 * i + j));
  return gw::from_vector(v, {rows, cols});
}

Tensor idx(std::vector<int64_t> v, Shape shape = {}) { return gw::from_vector(v, shape); }

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

// --- index_select ---------------------------------------------------------------------------

TEST_CASE("index_select picks slices along a dim", "[core][index]") {
  Tensor x = grid(3, 4);
  SECTION("rows, with repeats") {
    Tensor r = gw::index_select(x, 0, idx({2, 0, 2}));
    CHECK(r.sizes() == Shape{3, 4});
    CHECK(values(r) == std::vector<float>{20, 21, 22, 23, 0, 1, 2, 3, 20, 21, 22, 23});
  }
  SECTION("columns, by a negative dim and int32 indices") {
    Tensor r = gw::index_select(x, -1, gw::from_vector<int32_t>({3, 1}));
    CHECK(r.sizes() == Shape{3, 2});
    CHECK(values(r) == std::vector<float>{3, 1, 13, 11, 23, 21});
  }
  SECTION("from a transposed input") {
    Tensor r = gw::index_select(x.t(), 1, idx({1}));  // x.t()[:, 1] == x[1]
    CHECK(r.sizes() == Shape{4, 1});
    CHECK(values(r) == std::vector<float>{10, 11, 12, 13});
  }
  SECTION("the middle dim of a 3-D tensor") {
    Tensor x3 = grid(6, 4).view({2, 3, 4});
    Tensor r = gw::index_select(x3, 1, idx({2, 1}));
    CHECK(r.sizes() == Shape{2, 2, 4});
    std::vector<float> want;
    for (int a = 0; a < 2; ++a)
      for (int b : {2, 1})
        for (int c = 0; c < 4; ++c) want.push_back(static_cast<float>(10 * (a * 3 + b) + c));
    CHECK(values(r) == want);
  }
  SECTION("empty and 0-dim indices") {
    CHECK(gw::index_select(x, 0, idx({})).sizes() == Shape{0, 4});
    Tensor r = gw::index_select(x, 1, gw::scalar_tensor(int64_t{2}));
    CHECK(r.sizes() == Shape{3, 1});
    CHECK(values(r) == std::vector<float>{2, 12, 22});
  }
  SECTION("a copy, not a view") {
    Tensor r = gw::index_select(x, 0, idx({0}));
    r.fill_(-1.f);
    CHECK(values(x)[0] == 0.f);
  }
  SECTION("integer and bool inputs") {
    Tensor b = gw::from_vector<bool>({true, false, false, true}, {2, 2});
    CHECK(gw::index_select(b, 0, idx({1})).to_vector<bool>() == std::vector<bool>{false, true});
    Tensor i = gw::from_vector<int64_t>({5, 6, 7});
    CHECK(gw::index_select(i, 0, idx({2, 2})).to_vector<int64_t>() == std::vector<int64_t>{7, 7});
  }
}

TEST_CASE("index_select along a dim of an input with another empty dim", "[core][index]") {
  Tensor x = gw::zeros({3, 0});
  Tensor r = gw::index_select(x, 0, idx({0, 2}));
  CHECK(r.sizes() == Shape{2, 0});
}

// --- gather ---------------------------------------------------------------------------------

TEST_CASE("gather reads x[index] along a dim", "[core][index]") {
  Tensor x = grid(3, 4);
  SECTION("dim 1: out[i][j] = x[i][index[i][j]]") {
    std::vector<int64_t> iv{3, 0, 1, 1, 2, 3};
    Tensor r = gw::gather(x, 1, idx(iv, {3, 2}));
    CHECK(r.sizes() == Shape{3, 2});
    std::vector<float> want;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) want.push_back(static_cast<float>(10 * i + iv[i * 2 + j]));
    CHECK(values(r) == want);
  }
  SECTION("dim 0: out[i][j] = x[index[i][j]][j]") {
    std::vector<int64_t> iv{2, 0, 1, 2, 0, 0, 0, 1};
    Tensor r = gw::gather(x, 0, idx(iv, {2, 4}));
    std::vector<float> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) want.push_back(static_cast<float>(10 * iv[i * 4 + j] + j));
    CHECK(values(r) == want);
  }
  SECTION("an index smaller than x outside the dim") {
    Tensor r = gw::gather(x, -1, idx({1, 1, 0, 3}, {2, 2}));
    CHECK(values(r) == std::vector<float>{1, 1, 10, 13});
  }
  SECTION("from a transposed input, with a transposed index") {
    Tensor xt = x.t();  // (4,3), xt[i][j] = x[j][i]
    Tensor index = idx({0, 2, 1, 0, 2, 2}, {2, 3}).t();  // (3,2)
    Tensor r = gw::gather(xt, 1, index);
    // index = [[0,0],[2,2],[1,2]] -> out[i][j] = x[index[i][j]][i]
    CHECK(values(r) == std::vector<float>{0, 0, 21, 21, 12, 22});
  }
  SECTION("3-D") {
    Tensor x3 = grid(4, 3).view({2, 2, 3});  // x3[a][b][c] = 10 * (2a + b) + c
    Tensor r = gw::gather(x3, 1, idx({1, 0, 1, 0, 0, 0}, {2, 1, 3}));
    CHECK(r.sizes() == Shape{2, 1, 3});
    CHECK(values(r) == std::vector<float>{10, 1, 12, 20, 21, 22});
  }
}

TEST_CASE("gather and index_select of a 0-dim input", "[core][index]") {
  // torch.gather(torch.tensor(5.), 0, torch.tensor(0)) == tensor(5.)
  Tensor s = gw::scalar_tensor(5.0);
  CHECK(gw::gather(s, 0, gw::scalar_tensor(int64_t{0})).item<float>() == 5.f);
  CHECK(gw::index_select(s, 0, idx({0})).item<float>() == 5.f);
  // torch.zeros(()).scatter_add_(0, torch.tensor(0), torch.tensor(1.)) == tensor(1.)
  Tensor z = gw::zeros({});
  z.scatter_add_(0, gw::scalar_tensor(int64_t{0}), gw::scalar_tensor(1.0f));
  z.scatter_add_(-1, gw::scalar_tensor(int64_t{0}), gw::scalar_tensor(2.0f));
  CHECK(z.dim() == 0);
  CHECK(z.item<float>() == 3.f);
  CHECK_THROWS_AS(z.scatter_add_(1, gw::scalar_tensor(int64_t{0}), gw::scalar_tensor(1.0f)),
                  gw::IndexError);
}

// --- scatter_add ----------------------------------------------------------------------------

TEST_CASE("scatter_add adds src at indexed positions, duplicates accumulating", "[core][index]") {
  Tensor x = gw::ones({2, 5});
  std::vector<int64_t> iv{0, 4, 4, 4, 2, 2, 1, 0};
  std::vector<float> sv{1, 2, 3, 4, 5, 6, 7, 8};
  Tensor r = gw::scatter_add(x, 1, idx(iv, {2, 4}), gw::from_vector(sv, {2, 4}));
  std::vector<float> want(10, 1.f);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) want[i * 5 + iv[i * 4 + j]] += sv[i * 4 + j];
  CHECK(values(r) == want);
  CHECK(values(x) == std::vector<float>(10, 1.f));  // the input is untouched

  SECTION("only the index's extent of a larger src is used") {
    Tensor src = gw::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor s = gw::scatter_add(gw::zeros({3, 3}), 0, idx({2, 2}, {1, 2}), src);
    CHECK(values(s) == std::vector<float>{0, 0, 0, 0, 0, 0, 1, 2, 0});
  }
  SECTION("integer tensors") {
    Tensor s = gw::scatter_add(gw::zeros({3}, gw::kInt64), 0, idx({1, 1, 1}),
                               gw::from_vector<int64_t>({5, 6, 7}));
    CHECK(s.to_vector<int64_t>() == std::vector<int64_t>{0, 18, 0});
  }
}

// --- embedding and one_hot ------------------------------------------------------------------

TEST_CASE("embedding looks up rows for indices of any shape", "[core][index]") {
  Tensor w = grid(5, 3);
  Tensor r = gw::embedding(w, idx({4, 0, 4, 2, 1, 3}, {2, 3}));
  CHECK(r.sizes() == Shape{2, 3, 3});
  std::vector<float> want;
  for (int64_t row : {4, 0, 4, 2, 1, 3})
    for (int64_t c = 0; c < 3; ++c) want.push_back(static_cast<float>(10 * row + c));
  CHECK(values(r) == want);
  CHECK(gw::embedding(w, gw::scalar_tensor(int64_t{1})).sizes() == Shape{3});
  CHECK(values(gw::embedding(w, gw::scalar_tensor(int64_t{1}))) == std::vector<float>{10, 11, 12});
  CHECK(gw::embedding(w, gw::from_vector<int32_t>({2})).sizes() == Shape{1, 3});
}

TEST_CASE("one_hot encodes classes as int64 rows", "[core][index]") {
  Tensor r = gw::one_hot(idx({0, 2, 1}), 3);
  CHECK(r.dtype() == gw::kInt64);
  CHECK(r.sizes() == Shape{3, 3});
  CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 1, 0});
  Tensor r2 = gw::one_hot(idx({3, 0, 0, 1}, {2, 2}), 4);
  CHECK(r2.sizes() == Shape{2, 2, 4});
  std::vector<int64_t> want(16, 0);
  const int64_t classes[] = {3, 0, 0, 1};
  for (int i = 0; i < 4; ++i) want[i * 4 + classes[i]] = 1;
  CHECK(r2.to_vector<int64_t>() == want);
}

// --- cat and stack --------------------------------------------------------------------------

TEST_CASE("cat joins along a dim", "[core][index][cat]") {
  Tensor a = grid(2, 3), b = grid(1, 3) + 100.f, c = grid(2, 2) - 100.f;
  SECTION("dim 0") {
    Tensor r = gw::cat({a, b});
    CHECK(r.sizes() == Shape{3, 3});
    CHECK(values(r) == std::vector<float>{0, 1, 2, 10, 11, 12, 100, 101, 102});
  }
  SECTION("dim 1 and -1, three inputs, one of them transposed") {
    Tensor r = gw::cat({c, a, c.t()}, -1);
    CHECK(r.sizes() == Shape{2, 7});
    CHECK(values(r) == std::vector<float>{-100, -99, 0, 1, 2, -100, -90,  //
                                          -90, -89, 10, 11, 12, -99, -89});
    CHECK(gw::equal(r, gw::cat({c, a, c.t()}, 1)));
  }
  SECTION("a part with size 0 in the cat dim") {
    Tensor r = gw::cat({gw::zeros({2, 0}), a}, 1);
    CHECK(gw::equal(r, a));
  }
  SECTION("1-D empty tensors are skipped") {
    Tensor r = gw::cat({gw::zeros({0}), a, gw::zeros({0})});
    CHECK(gw::equal(r, a));
  }
  SECTION("a single tensor is copied") {
    Tensor r = gw::cat({a});
    CHECK(gw::equal(r, a));
    CHECK(r.storage() != a.storage());
  }
}

TEST_CASE("cat promotes dtypes", "[core][index][cat]") {
  Tensor r = gw::cat({gw::from_vector<int32_t>({1, 2}), gw::from_vector<float>({0.5f})});
  CHECK(r.dtype() == gw::kFloat32);
  CHECK(r.to_vector<float>() == std::vector<float>{1, 2, 0.5f});
  Tensor i = gw::cat({gw::from_vector<int32_t>({1}), gw::from_vector<int64_t>({1ll << 40})});
  CHECK(i.dtype() == gw::kInt64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 1ll << 40});
  Tensor b = gw::cat({gw::from_vector<bool>({true}), gw::from_vector<int32_t>({7})});
  CHECK(b.dtype() == gw::kInt32);
  CHECK(b.to_vector<int32_t>() == std::vector<int32_t>{1, 7});
}

TEST_CASE("cat's skipped 1-D empty tensors still take part in type promotion",
          "[core][index][cat]") {
  // torch.cat([torch.zeros(0), torch.ones(2, 2, dtype=torch.int32)]).dtype == torch.float32
  Tensor r = gw::cat({gw::zeros({0}), gw::ones({2, 2}, gw::kInt32)});
  CHECK(r.dtype() == gw::kFloat32);
  CHECK(r.sizes() == Shape{2, 2});
}

TEST_CASE("stack adds a new dim", "[core][index]") {
  Tensor a = grid(2, 3), b = grid(2, 3) + 50.f;
  Tensor s0 = gw::stack({a, b});
  CHECK(s0.sizes() == Shape{2, 2, 3});
  CHECK(gw::equal(s0[0], a));
  CHECK(gw::equal(s0[1], b));
  Tensor s1 = gw::stack({a, b}, 1);
  CHECK(s1.sizes() == Shape{2, 2, 3});
  CHECK(gw::equal(s1.select(1, 0), a));
  CHECK(gw::equal(s1.select(1, 1), b));
  Tensor s2 = gw::stack({a, b, a}, -1);
  CHECK(s2.sizes() == Shape{2, 3, 3});
  std::vector<float> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (float off : {0.f, 50.f, 0.f}) want.push_back(static_cast<float>(10 * i + j) + off);
  CHECK(values(s2) == want);
  Tensor scalars = gw::stack({gw::scalar_tensor(1.0), gw::scalar_tensor(2.0)});
  CHECK(scalars.sizes() == Shape{2});
  CHECK(values(scalars) == std::vector<float>{1, 2});
}

// --- split and chunk ------------------------------------------------------------------------

TEST_CASE("split by size returns views, the last one shorter", "[core][index][split]") {
  Tensor x = gw::arange(10);
  std::vector<Tensor> parts = gw::split(x, 4);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(parts[1].to_vector<int64_t>() == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(parts[2].to_vector<int64_t>() == std::vector<int64_t>{8, 9});
  for (const Tensor& p : parts) CHECK(p.storage() == x.storage());
  parts[1].fill_(-1);
  CHECK(x.to_vector<int64_t>()[5] == -1);

  CHECK(gw::split(x, 10).size() == 1);
  CHECK(gw::split(x, 20).size() == 1);
  CHECK(gw::split(x, 20)[0].sizes() == Shape{10});
  CHECK(gw::split(x, 5).size() == 2);

  Tensor m = grid(2, 5);
  std::vector<Tensor> cols = gw::split(m, 2, -1);
  REQUIRE(cols.size() == 3);
  CHECK(cols[2].sizes() == Shape{2, 1});
  CHECK(values(cols[1]) == std::vector<float>{2, 3, 12, 13});
}

TEST_CASE("split by explicit sizes", "[core][index][split]") {
  Tensor m = grid(6, 2);
  std::vector<Tensor> parts = gw::split(m, std::vector<int64_t>{1, 3, 0, 2});
  REQUIRE(parts.size() == 4);
  CHECK(parts[0].sizes() == Shape{1, 2});
  CHECK(parts[1].sizes() == Shape{3, 2});
  CHECK(parts[2].sizes() == Shape{0, 2});
  CHECK(parts[3].sizes() == Shape{2, 2});
  CHECK(values(parts[1]) == std::vector<float>{10, 11, 20, 21, 30, 31});
  CHECK(values(parts[3]) == std::vector<float>{40, 41, 50, 51});
  std::vector<Tensor> cols = gw::split(m, std::vector<int64_t>{1, 1}, 1);
  CHECK(values(cols[1]) == std::vector<float>{1, 11, 21, 31, 41, 51});
}

TEST_CASE("chunk splits into at most n nearly equal pieces", "[core][index][split]") {
  auto sizes = [](const std::vector<Tensor>& parts) {
    std::vector<int64_t> s;
    for (const Tensor& p : parts) s.push_back(p.size(0));
    return s;
  };
  // The expected sizes are torch.arange(n).chunk(c) for each case.
  CHECK(sizes(gw::chunk(gw::arange(10), 4)) == std::vector<int64_t>{3, 3, 3, 1});
  CHECK(sizes(gw::chunk(gw::arange(5), 3)) == std::vector<int64_t>{2, 2, 1});
  CHECK(sizes(gw::chunk(gw::arange(6), 3)) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(gw::chunk(gw::arange(6), 4)) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(gw::chunk(gw::arange(3), 5)) == std::vector<int64_t>{1, 1, 1});
  CHECK(sizes(gw::chunk(gw::arange(7), 1)) == std::vector<int64_t>{7});
  CHECK(sizes(gw::chunk(gw::arange(0), 3)) == std::vector<int64_t>{0, 0, 0});
  std::vector<Tensor> parts = gw::chunk(grid(2, 6), 3, 1);
  REQUIRE(parts.size() == 3);
  CHECK(values(parts[2]) == std::vector<float>{4, 5, 14, 15});
  CHECK(parts[2].storage() == parts[0].storage());
  // The pieces cover the input exactly once.
  std::vector<Tensor> back(parts.begin(), parts.end());
  CHECK(gw::equal(gw::cat(back, 1), grid(2, 6)));
}
