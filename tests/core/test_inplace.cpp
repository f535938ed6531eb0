// In-place methods of gw::Tensor: zero_, fill_, copy_, add_/sub_/mul_/div_, clamp_,
// masked_fill_ and scatter_add_, on contiguous and strided tensors, with the version counter.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "test_util.h"

using core_test::at;
using core_test::iota;
using core_test::version;
using gw::Shape;
using gw::Tensor;

// --- in-place ops ---------------------------------------------------------------------------

TEST_CASE("zero_ and fill_ write every element of the (possibly strided) tensor",
          "[core][tensor][inplace]") {
  Tensor b = iota({3, 4});
  uint64_t v0 = version(b);
  b.slice(1, 0, 4, 2).zero_();
  CHECK(version(b) == v0 + 1);
  CHECK(b.to_vector<float>() == std::vector<float>{0, 1, 0, 3, 0, 5, 0, 7, 0, 9, 0, 11});

  Tensor& same = b.fill_(2.5);
  CHECK(&same == &b);
  CHECK(version(b) == v0 + 2);
  for (float x : b.to_vector<float>()) CHECK(x == 2.5f);

  Tensor t = b.t();
  t.fill_(7);  // an integer scalar into a float tensor
  for (float x : b.to_vector<float>()) CHECK(x == 7.f);

  Tensor i = gw::zeros({3}, gw::kInt32);
  i.fill_(2.9);  // converted like static_cast
  CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{2, 2, 2});
  Tensor flags = gw::zeros({2}, gw::kBool);
  flags.fill_(true);
  CHECK(flags.to_vector<bool>() == std::vector<bool>{true, true});
}

TEST_CASE("copy_ broadcasts, converts dtype and handles overlap", "[core][tensor][inplace]") {
  SECTION("broadcasting a row into a matrix") {
    Tensor dst = gw::zeros({3, 4});
    uint64_t v0 = version(dst);
    Tensor& r = dst.copy_(iota({4}));
    CHECK(&r == &dst);
    CHECK(version(dst) == v0 + 1);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t k = 0; k < 4; ++k) CHECK(at(dst, {i, k}) == static_cast<float>(k));
    dst.copy_(gw::scalar_tensor(1.5));
    for (float x : dst.to_vector<float>()) CHECK(x == 1.5f);
  }
  SECTION("converting dtypes") {
    Tensor dst = gw::zeros({3});
    dst.copy_(gw::from_vector<int64_t>({4, -5, 6}));
    CHECK(dst.to_vector<float>() == std::vector<float>{4, -5, 6});
    Tensor ints = gw::zeros({3}, gw::kInt32);
    ints.copy_(gw::from_vector<double>({1.9, -1.9, 0.2}));
    CHECK(ints.to_vector<int32_t>() == std::vector<int32_t>{1, -1, 0});
  }
  SECTION("into a strided destination from a strided source") {
    Tensor dst = gw::zeros({4, 3});
    dst.t().copy_(iota({3, 4}));  // dst = iota.T
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) CHECK(at(dst, {i, j}) == static_cast<float>(j * 4 + i));
  }
  SECTION("the source overlaps the destination: read before written") {
    Tensor x = iota({3, 3});
    x.copy_(x.t());
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 3; ++j) CHECK(at(x, {i, j}) == static_cast<float>(j * 3 + i));
    Tensor y = iota({6});
    y.slice(0, 1, 6).copy_(y.slice(0, 0, 5));  // shift right by one
    CHECK(y.to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 4});
    Tensor z = iota({6});
    z.copy_(z);  // a no-op
    CHECK(z.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  }
}

TEST_CASE("arithmetic in place: add_, sub_, mul_, div_", "[core][tensor][inplace]") {
  const std::vector<float> base{1, -2, 3, 4, 5, -6};
  const std::vector<float> row{2, 4, -8};
  auto fresh = [&] { return gw::from_vector(base, {2, 3}); };
  Tensor other = gw::from_vector(row, {3});  // broadcast over rows
  auto expect = [&](const Tensor& t, auto f) {
    std::vector<float> got = t.to_vector<float>();
    REQUIRE(got.size() == base.size());
    for (size_t i = 0; i < base.size(); ++i) CHECK(got[i] == Approx(f(base[i], row[i % 3])));
  };

  SECTION("add_") {
    Tensor t = fresh();
    uint64_t v0 = version(t);
    Tensor& r = t.add_(other);
    CHECK(&r == &t);
    CHECK(version(t) == v0 + 1);
    expect(t, [](float a, float b) { return a + b; });
    Tensor u = fresh();
    u.add_(other, 0.5);
    expect(u, [](float a, float b) { return a + 0.5f * b; });
    Tensor w = fresh();
    w.add_(2);
    expect(w, [](float a, float) { return a + 2; });
    Tensor plus = fresh();
    plus += other;
    expect(plus, [](float a, float b) { return a + b; });
  }
  SECTION("sub_") {
    Tensor t = fresh();
    t.sub_(other);
    expect(t, [](float a, float b) { return a - b; });
    Tensor u = fresh();
    u.sub_(other, 3);
    expect(u, [](float a, float b) { return a - 3 * b; });
    Tensor w = fresh();
    uint64_t v0 = version(w);
    w.sub_(1.5);
    CHECK(version(w) == v0 + 1);
    expect(w, [](float a, float) { return a - 1.5f; });
  }
  SECTION("mul_") {
    Tensor t = fresh();
    t.mul_(other);
    expect(t, [](float a, float b) { return a * b; });
    Tensor w = fresh();
    w *= 3;
    expect(w, [](float a, float) { return a * 3; });
  }
  SECTION("div_") {
    Tensor t = fresh();
    t.div_(other);
    expect(t, [](float a, float b) { return a / b; });
    Tensor w = fresh();
    w /= 4;
    expect(w, [](float a, float) { return a / 4; });
  }
  SECTION("through a view, reading an overlapping operand") {
    Tensor t = iota({4});
    uint64_t v0 = version(t);
    t.slice(0, 0, 2).add_(t.slice(0, 2, 4));
    CHECK(version(t) == v0 + 1);
    CHECK(t.to_vector<float>() == std::vector<float>{2, 4, 2, 3});
    Tensor u = iota({2, 2});
    u.add_(u.t());  // reads the original values of the overlapping operand
    CHECK(u.to_vector<float>() == std::vector<float>{0, 3, 3, 6});
  }
  SECTION("integer tensors stay integer") {
    Tensor i = gw::from_vector<int32_t>({1, 2, 3});
    i.add_(gw::from_vector<int64_t>({10, 20, 30}));
    i.mul_(2);
    CHECK(i.dtype() == gw::kInt32);
    CHECK(i.to_vector<int32_t>() == std::vector<int32_t>{22, 44, 66});
    Tensor f = gw::from_vector<float>({1, 2});
    f.add_(gw::from_vector<int64_t>({1, 1}));  // int into float is fine
    CHECK(f.to_vector<float>() == std::vector<float>{2, 3});
  }
}

TEST_CASE("clamp_ limits values in place", "[core][tensor][inplace]") {
  const std::vector<float> v{-3, -1, 0, 2, 5};
  Tensor a = gw::from_vector(v);
  uint64_t v0 = version(a);
  Tensor& r = a.clamp_(-1.5, 2.5);
  CHECK(&r == &a);
  CHECK(version(a) > v0);
  CHECK(a.to_vector<float>() == std::vector<float>{-1.5f, -1, 0, 2, 2.5f});
  Tensor lo = gw::from_vector(v);
  lo.clamp_(0, std::nullopt);
  CHECK(lo.to_vector<float>() == std::vector<float>{0, 0, 0, 2, 5});
  Tensor hi = gw::from_vector(v);
  hi.clamp_(std::nullopt, 1);
  CHECK(hi.to_vector<float>() == std::vector<float>{-3, -1, 0, 1, 1});
  Tensor i = gw::from_vector<int64_t>({-7, 3, 9});
  i.clamp_(0, 5);
  CHECK(i.dtype() == gw::kInt64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{0, 3, 5});
}

TEST_CASE("masked_fill_ writes where the broadcast mask is true", "[core][tensor][inplace]") {
  Tensor a = iota({2, 3});
  Tensor mask = gw::from_vector<bool>({true, false, true});  // broadcast over rows
  uint64_t v0 = version(a);
  Tensor& r = a.masked_fill_(mask, -1.0);
  CHECK(&r == &a);
  CHECK(version(a) == v0 + 1);
  CHECK(a.to_vector<float>() == std::vector<float>{-1, 1, -1, -1, 4, -1});
  Tensor i = gw::from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  i.t().masked_fill_(gw::from_vector<bool>({false, true, false, false}, {2, 2}), 9);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 9, 4});  // i.T[0][1] is i[1][0]
}

TEST_CASE("scatter_add_ accumulates at indexed positions", "[core][tensor][inplace]") {
  SECTION("along dim 0 with duplicate indices") {
    Tensor self = gw::zeros({3, 2});
    Tensor index = gw::from_vector<int64_t>({0, 2, 0, 0, 1, 2}, {3, 2});
    Tensor src = gw::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
    uint64_t v0 = version(self);
    Tensor& r = self.scatter_add_(0, index, src);
    CHECK(&r == &self);
    CHECK(version(self) == v0 + 1);
    // self[index[i][j]][j] += src[i][j]
    std::vector<float> expected(6, 0.f);
    const std::vector<int64_t> idx{0, 2, 0, 0, 1, 2};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) expected[idx[i * 2 + j] * 2 + j] += static_cast<float>(i * 2 + j + 1);
    CHECK(self.to_vector<float>() == expected);
  }
  SECTION("along the last dim, into a strided self") {
    Tensor base = gw::ones({2, 4});
    Tensor self = base.slice(1, 0, 4, 2);  // columns 0 and 2
    Tensor index = gw::from_vector<int64_t>({1, 1, 1, 0, 0, 0}, {2, 3});
    Tensor src = gw::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    self.scatter_add_(-1, index, src);
    CHECK(base.to_vector<float>() == std::vector<float>{1, 1, 7, 1, 16, 1, 1, 1});
  }
}
