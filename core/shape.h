// Shapes, strides and the arithmetic on them: element counts, contiguous strides, PyTorch
// broadcasting, negative-dim wrapping. Strides and offsets count elements, not bytes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/small_vector.h"

namespace gw {

// Sizes or strides of a tensor; up to 6 dims without a heap allocation.
using Shape = SmallVector<int64_t, 6>;

int64_t numel(std::span<const int64_t> shape);
Shape contiguous_strides(std::span<const int64_t> shape);
bool is_contiguous(std::span<const int64_t> shape, std::span<const int64_t> strides);

// "(2,3)"; a scalar shape prints as "()".
std::string shape_str(std::span<const int64_t> shape);

// PyTorch broadcasting; `op` names the caller in the error message.
Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b,
                       std::string_view op);

// Maps dim in [-ndim, ndim) to [0, ndim); an IndexError naming `op` otherwise.
int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op);

// The bytes of a contiguous tensor of `shape` with elements of `itemsize` bytes; a ShapeError
// naming `op` for a negative size, or when the bytes or a contiguous stride (the product of the
// sizes, a 0 counted as 1) would not fit in int64.
int64_t storage_nbytes(std::span<const int64_t> shape, int64_t itemsize, std::string_view op);

// Checks a user-supplied shape (all sizes >= 0) and resolves one -1 against `total` elements.
Shape infer_shape(std::span<const int64_t> shape, int64_t total, std::string_view op);

}  // namespace gw
