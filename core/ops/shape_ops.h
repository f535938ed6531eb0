// Free-function forms of the views (see the methods on Tensor) and the ops that combine or
// split tensors: cat, stack, split, chunk.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace gw {

Tensor reshape(const Tensor& x, Shape shape);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, Shape dims);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, Shape shape);
Tensor broadcast_to(const Tensor& x, Shape shape);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
// The elements `x` reads, once each: every broadcast dim (stride 0) cut to one. Converted and
// expanded again to x's shape, a broadcast operand stays broadcast (a copy would not).
Tensor unexpanded(const Tensor& x);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of `split_size` along dim (the last may be shorter), or of the given sizes.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace gw
