#include "core/shape.h"

#include <algorithm>

#include "core/error.h"

namespace gw {

int64_t numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

bool is_contiguous(std::span<const int64_t> shape, std::span<const int64_t> strides) {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;  // the stride of a size-1 dim never matters
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b,
                       std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    GW_CHECK(da == db || da == 1 || db == 1, ShapeError, "[", op, "] shapes ", shape_str(a),
             " and ", shape_str(b), " cannot be broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  GW_CHECK(dim >= lo && dim <= hi, IndexError, "[", op, "] dim ", dim,
           " is out of range for a tensor of ", ndim, " dims (expected ", lo, "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

int64_t storage_nbytes(std::span<const int64_t> shape, int64_t itemsize, std::string_view op) {
  int64_t bytes = itemsize;
  for (int64_t s : shape) {
    GW_CHECK(s >= 0, ShapeError, "[", op, "] negative size in shape ", shape_str(shape));
    GW_CHECK(!__builtin_mul_overflow(bytes, std::max<int64_t>(s, 1), &bytes), ShapeError, "[", op,
             "] shape ", shape_str(shape), " of ", itemsize, "-byte elements is too large");
  }
  return numel(shape) == 0 ? 0 : bytes;
}

Shape infer_shape(std::span<const int64_t> shape, int64_t total, std::string_view op) {
  Shape out(shape.begin(), shape.end());
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      GW_CHECK(infer < 0, ShapeError, "[", op, "] only one dim may be -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      GW_CHECK(out[i] >= 0, ShapeError, "[", op, "] invalid size ", out[i], " in ",
               shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    GW_CHECK(known != 0 && total % known == 0, ShapeError, "[", op, "] shape ", shape_str(shape),
             " is invalid for ", total, " elements");
    out[infer] = total / known;
  } else {
    GW_CHECK(known == total, ShapeError, "[", op, "] shape ", shape_str(shape),
             " is invalid for ", total, " elements");
  }
  return out;
}

}  // namespace gw
