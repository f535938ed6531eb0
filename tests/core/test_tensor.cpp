// gw::Tensor itself: construction, geometry, element access, shallow vs deep copies and dtype
// conversion. Views are in test_views.cpp, in-place methods in test_inplace.cpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "test_util.h"

using core_test::at;
using core_test::iota;
using gw::Shape;
using gw::Tensor;

namespace {

// The elements of a contiguous tensor of any computable dtype, read raw and widened to double.
std::vector<double> raw_values(const Tensor& t) {
  REQUIRE(t.is_contiguous());
  std::vector<double> out;
  gw::dispatch<gw::AllTypes>(t.dtype(), "test", [&]<typename T>() {
    const T* p = static_cast<const T*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<double>(p[i]));
  });
  return out;
}

// A 1-D tensor of `dtype` holding `values` (each converted with static_cast).
Tensor typed(gw::DType dtype, const std::vector<double>& values) {
  Tensor out;
  gw::dispatch<gw::AllTypes>(dtype, "test", [&]<typename T>() {
    std::vector<T> v;
    for (double x : values) v.push_back(static_cast<T>(x));
    out = gw::from_vector(v);
  });
  return out;
}

template <typename T>
T convert_like_cpp(double v, gw::DType from) {
  // What the element becomes after passing through the source dtype, then the target.
  double src = 0;
  gw::dispatch<gw::AllTypes>(from, "test", [&]<typename S>() {
    src = static_cast<double>(static_cast<S>(v));
  });
  return static_cast<T>(src);
}

}  // namespace

// --- construction ---------------------------------------------------------------------------

TEST_CASE("a default-constructed tensor is undefined", "[core][tensor]") {
  Tensor t;
  CHECK_FALSE(t.defined());
  CHECK(t.impl() == nullptr);
  CHECK_THROWS_AS(t.sizes(), gw::StateError);
  CHECK(gw::zeros({1}).defined());
}

TEST_CASE("from_vector copies values and infers dtype and shape", "[core][tensor]") {
  SECTION("float, 1-D by default") {
    std::vector<float> v{1.5f, -2.f, 3.f};
    Tensor t = gw::from_vector(v);
    CHECK(t.dtype() == gw::kFloat32);
    CHECK(t.sizes() == Shape{3});
    CHECK(t.to_vector<float>() == v);
    v[0] = 100.f;  // the tensor owns a copy
    CHECK(t.to_vector<float>()[0] == 1.5f);
  }
  SECTION("each C++ type maps to its dtype") {
    CHECK(gw::from_vector<double>({1, 2}).dtype() == gw::kFloat64);
    CHECK(gw::from_vector<int64_t>({1, 2}).dtype() == gw::kInt64);
    CHECK(gw::from_vector<int32_t>({1, 2}).dtype() == gw::kInt32);
    CHECK(gw::from_vector<bool>({true, false}).dtype() == gw::kBool);
    CHECK(gw::from_vector<bool>({true, false, true}).to_vector<bool>() ==
          std::vector<bool>{true, false, true});
  }
  SECTION("an explicit shape") {
    Tensor t = gw::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 1, 3});
    CHECK(t.sizes() == Shape{2, 1, 3});
    CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
    CHECK(t.is_contiguous());
  }
  SECTION("an empty vector gives a 1-D tensor of size 0") {
    Tensor t = gw::from_vector<float>({});
    CHECK(t.sizes() == Shape{0});
    CHECK(t.numel() == 0);
  }
  SECTION("gw::tensor from nested initializer lists") {
    Tensor m = gw::tensor({{1, 2, 3}, {4, 5, 6}});
    CHECK(m.dtype() == gw::kInt32);  // int literals are int32, as in C++
    CHECK(m.sizes() == Shape{2, 3});
    CHECK(m.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
    Tensor v = gw::tensor({1.0, 2.0});
    CHECK(v.dtype() == gw::kFloat64);
    CHECK(v.sizes() == Shape{2});
  }
}

namespace {
void count_deletes(void* ctx, void* ptr) {
  auto* log = static_cast<std::vector<void*>*>(ctx);
  log->push_back(ptr);
}
}  // namespace

TEST_CASE("from_blob wraps external memory and runs the deleter after the last view",
          "[core][tensor]") {
  std::vector<float> buffer{0, 1, 2, 3, 4, 5};
  std::vector<void*> deleted;
  {
    Tensor t = gw::from_blob(buffer.data(), {2, 3}, gw::kFloat32,
                             gw::Deleter{&count_deletes, &deleted});
    CHECK(t.data_ptr<float>() == buffer.data());
    CHECK(t.sizes() == Shape{2, 3});
    CHECK(t.strides() == Shape{3, 1});
    buffer[4] = 42.f;  // no copy: the tensor sees writes to the buffer...
    CHECK(at(t, {1, 1}) == 42.f);
    t.select(0, 0).fill_(-1.f);  // ...and the buffer sees writes through the tensor
    CHECK(buffer[0] == -1.f);
    CHECK(buffer[2] == -1.f);
    CHECK(buffer[3] == 3.f);

    Tensor view = t.transpose(0, 1);
    t = Tensor();
    CHECK(deleted.empty());  // the transposed view still holds the storage
    CHECK(at(view, {2, 1}) == 5.f);
  }
  REQUIRE(deleted.size() == 1);
  CHECK(deleted[0] == buffer.data());
}

TEST_CASE("from_blob without a deleter leaves the memory alone", "[core][tensor]") {
  int64_t data[4] = {7, 8, 9, 10};
  { Tensor t = gw::from_blob(data, {4}, gw::kInt64); CHECK(t.to_vector<int64_t>()[3] == 10); }
  CHECK(data[0] == 7);  // still valid and untouched
}

TEST_CASE("scalar_tensor makes 0-dim tensors typed by the scalar", "[core][tensor]") {
  Tensor f = gw::scalar_tensor(2.5);
  CHECK(f.dim() == 0);
  CHECK(f.sizes().empty());
  CHECK(f.numel() == 1);
  CHECK(f.dtype() == gw::kFloat32);
  CHECK(f.item<float>() == 2.5f);

  CHECK(gw::scalar_tensor(int64_t{-3}).dtype() == gw::kInt64);
  CHECK(gw::scalar_tensor(7).dtype() == gw::kInt64);  // any C++ integer is an integral scalar
  CHECK(gw::scalar_tensor(true).dtype() == gw::kBool);
  CHECK(gw::scalar_tensor(-3).item<int64_t>() == -3);

  Tensor d = gw::scalar_tensor(1.25, gw::kFloat64);
  CHECK(d.dtype() == gw::kFloat64);
  CHECK(d.item<double>() == 1.25);
  CHECK(gw::scalar_tensor(3.75, gw::kInt32).item<int32_t>() == 3);
}

// --- geometry and element access -------------------------------------------------------------

TEST_CASE("geometry accessors describe sizes, strides and memory", "[core][tensor]") {
  Tensor t = gw::zeros({2, 3, 4}, gw::kFloat64);
  CHECK(t.dim() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.sizes() == Shape{2, 3, 4});
  CHECK(t.shape() == t.sizes());
  CHECK(t.strides() == Shape{12, 4, 1});
  CHECK(t.size(0) == 2);
  CHECK(t.size(-1) == 4);
  CHECK(t.stride(-3) == 12);
  CHECK(t.storage_offset() == 0);
  CHECK(t.is_contiguous());
  CHECK(t.element_size() == 8);
  CHECK(t.nbytes() == 24 * 8);
  CHECK(t.device() == gw::kCPU);
  CHECK(t.is_floating_point());
  CHECK_FALSE(gw::zeros({2}, gw::kInt32).is_floating_point());
  CHECK(t.options().dtype == gw::kFloat64);
  CHECK(t.options().device == gw::kCPU);
  CHECK(t.storage()->nbytes() >= t.nbytes());

  Tensor s = t.select(1, 2);
  CHECK(s.storage_offset() == 8);
  CHECK(s.strides() == Shape{12, 1});
  CHECK_FALSE(s.is_contiguous());
  CHECK_FALSE(t.transpose(0, 2).is_contiguous());
  CHECK(gw::zeros({3, 1}).expand({3, 1}).is_contiguous());
}

TEST_CASE("item and to_vector convert to the requested type", "[core][tensor]") {
  Tensor f = gw::from_vector<float>({2.75f});
  CHECK(f.item<float>() == 2.75f);
  CHECK(f.item<double>() == 2.75);
  CHECK(f.item<int64_t>() == 2);  // truncation, like static_cast
  CHECK(gw::from_vector<float>({-2.75f}).item<int32_t>() == -2);

  CHECK(f.item().is_floating());
  CHECK(f.item().to_double() == 2.75);
  CHECK(gw::from_vector<int32_t>({-4}).item().is_integral());
  CHECK(gw::from_vector<int32_t>({-4}).item().to<int64_t>() == -4);
  CHECK(gw::from_vector<bool>({true}).item().is_bool());

  // A one-element tensor of any rank has an item.
  CHECK(gw::from_vector<float>({9.f}, {1, 1, 1}).item<float>() == 9.f);

  Tensor ints = gw::from_vector<int64_t>({1, -2, 3}, {3});
  CHECK(ints.to_vector<double>() == std::vector<double>{1, -2, 3});
  CHECK(ints.to_vector<bool>() == std::vector<bool>{true, true, true});
  // to_vector of a view follows the view's logical order.
  Tensor m = iota({2, 3});
  CHECK(m.t().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
}

// --- copies ---------------------------------------------------------------------------------

TEST_CASE("copying a Tensor is shallow; clone is deep", "[core][tensor]") {
  Tensor a = iota({2, 2});
  Tensor b = a;  // same handle
  CHECK(b.same(a));
  b.fill_(5.f);
  CHECK(a.to_vector<float>() == std::vector<float>{5, 5, 5, 5});

  Tensor c = a.clone();
  CHECK_FALSE(c.same(a));
  CHECK(c.storage() != a.storage());
  CHECK(c.to_vector<float>() == a.to_vector<float>());
  c.fill_(1.f);
  CHECK(a.to_vector<float>() == std::vector<float>{5, 5, 5, 5});

  SECTION("clone of a view copies only the view, contiguously") {
    Tensor base = iota({3, 4});
    Tensor v = base.slice(1, 1, 4, 2).t();  // (2,3), non-contiguous
    Tensor cv = v.clone();
    CHECK(cv.is_contiguous());
    CHECK(cv.sizes() == Shape{2, 3});
    CHECK(cv.storage_offset() == 0);
    CHECK(cv.to_vector<float>() == std::vector<float>{1, 5, 9, 3, 7, 11});
    CHECK(cv.dtype() == base.dtype());
  }
  SECTION("detach shares storage") {
    Tensor d = a.detach();
    CHECK_FALSE(d.same(a));
    CHECK(d.storage() == a.storage());
  }
}

TEST_CASE("contiguous returns the tensor itself or a row-major copy", "[core][tensor]") {
  Tensor a = iota({3, 4});
  CHECK(a.contiguous().same(a));
  Tensor t = a.t();
  Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.storage() != a.storage());
  CHECK(c.strides() == Shape{3, 1});
  std::vector<float> expected;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 3; ++i) expected.push_back(static_cast<float>(i * 4 + j));
  CHECK(raw_values(c) == std::vector<double>(expected.begin(), expected.end()));
}

TEST_CASE("to(dtype) converts between every pair of dtypes", "[core][tensor]") {
  const std::vector<gw::DType> types{gw::kBool, gw::kInt32, gw::kInt64, gw::kFloat32,
                                     gw::kFloat64};
  const std::vector<double> values{0, 1, -2, 3, 0, 100};
  for (gw::DType from : types) {
    for (gw::DType to : types) {
      CAPTURE(from, to);
      Tensor src = typed(from, values);
      Tensor dst = src.to(to);
      CHECK(dst.dtype() == to);
      CHECK(dst.sizes() == src.sizes());
      std::vector<double> expected;
      gw::dispatch<gw::AllTypes>(to, "test", [&]<typename T>() {
        for (double v : values) expected.push_back(static_cast<double>(convert_like_cpp<T>(v, from)));
      });
      CHECK(raw_values(dst) == expected);
      if (from == to) {
        CHECK(dst.same(src));
      } else {
        CHECK(dst.storage() != src.storage());
      }
    }
  }
}

TEST_CASE("to(dtype) truncates floats toward zero and maps nonzero to true", "[core][tensor]") {
  Tensor f = gw::from_vector<double>({2.7, -2.7, 0.5, -0.0, 1e-30});
  CHECK(f.to(gw::kInt32).to_vector<int32_t>() == std::vector<int32_t>{2, -2, 0, 0, 0});
  CHECK(f.to(gw::kInt64).to_vector<int64_t>() == std::vector<int64_t>{2, -2, 0, 0, 0});
  CHECK(f.to(gw::kBool).to_vector<bool>() == std::vector<bool>{true, true, true, false, true});
  SECTION("of a non-contiguous source") {
    Tensor t = iota({2, 3}).t().to(gw::kInt64);
    CHECK(t.sizes() == Shape{3, 2});
    CHECK(t.is_contiguous());
    CHECK(raw_values(t) == std::vector<double>{0, 3, 1, 4, 2, 5});
  }
}

TEST_CASE("float16 and bfloat16 tensors are made by zeros, ones, full and eye", "[core][tensor]") {
  // A fill only stores (no float32 round trip); the values read back in float32 are the
  // rounded scalars.
  for (gw::DType t : {gw::kFloat16, gw::kBFloat16}) {
    CAPTURE(t);
    CHECK(gw::zeros({2, 3}, t).to(gw::kFloat32).to_vector<float>() == std::vector<float>(6, 0.f));
    CHECK(gw::ones({4}, t).to(gw::kFloat32).to_vector<float>() == std::vector<float>(4, 1.f));
    CHECK(gw::full({3}, 2.5, t).to(gw::kFloat32).to_vector<float>() == std::vector<float>(3, 2.5f));
    const float third = t == gw::kFloat16 ? gw::convert<float>(gw::convert<gw::Half>(1.f / 3))
                                          : gw::convert<float>(gw::convert<gw::BFloat16>(1.f / 3));
    CHECK(gw::full({1}, 1.0 / 3, t).to(gw::kFloat32).item<float>() == third);
    CHECK(third != 1.f / 3);  // rounded to the 16-bit format
    CHECK(gw::eye(2, 3, t).to(gw::kFloat32).to_vector<float>() ==
          std::vector<float>{1, 0, 0, 0, 1, 0});
  }
}
