// Helpers shared by the core tests: tensors built and read without gradwire ops (so a check
// tests the op, not the helper), and a broadcasting reference that uses no gradwire code.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/ops.h"

namespace core_test {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Restores the thread count when a test changes it.
struct ThreadsGuard {
  int saved = gw::get_num_threads();
  ~ThreadsGuard() { gw::set_num_threads(saved); }
};

// A tensor of a 16-bit float dtype from raw bit patterns (no conversion on the way), of
// `shape`, or 1-D when it is empty.
inline gw::Tensor from_bits(const std::vector<uint16_t>& bits, gw::DType dtype,
                            gw::Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(bits.size())};
  gw::Tensor t = gw::empty(shape, dtype);
  REQUIRE(t.nbytes() == bits.size() * 2);
  std::memcpy(t.raw_data(), bits.data(), bits.size() * 2);
  return t;
}

// A float32 tensor holding 0, 1, 2, ... in row-major order, built without any gradwire op.
inline gw::Tensor iota(gw::Shape shape) {
  std::vector<float> v(static_cast<size_t>(gw::numel(shape)));
  std::iota(v.begin(), v.end(), 0.f);
  return gw::from_vector(v, shape);
}

// A tensor of `dtype` holding `v` in row-major order (`shape` {} makes a 0-dim tensor of v[0]).
inline gw::Tensor make(const std::vector<double>& v, gw::Shape shape,
                       gw::DType dtype = gw::kFloat64) {
  gw::Tensor t = shape.empty() ? gw::scalar_tensor(v.at(0), gw::kFloat64)
                               : gw::from_vector(v, shape);
  return t.to(dtype);
}

// Element `idx` of a float32 tensor read straight from its storage through its strides, so the
// checks test the view geometry rather than a copy kernel.
inline float at(const gw::Tensor& t, std::vector<int64_t> idx) {
  REQUIRE(static_cast<int64_t>(idx.size()) == t.dim());
  int64_t off = t.storage_offset();
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return static_cast<const float*>(t.storage()->data())[off];
}

inline uint64_t version(const gw::Tensor& t) { return t.storage()->version(); }

// PyTorch's broadcast of two shapes, assuming they are compatible.
inline gw::Shape broadcast_ref(const gw::Shape& a, const gw::Shape& b) {
  size_t n = std::max(a.size(), b.size());
  gw::Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat row-major index into a contiguous tensor of shape `s` for a multi-index `idx` of the
// (longer or equal) broadcast shape.
inline int64_t source_index(const gw::Shape& s, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  size_t lead = idx.size() - s.size();
  for (size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : idx[lead + d]);
  return flat;
}

}  // namespace core_test
