// Indexing with int64 index tensors, as in PyTorch. Every index is bounds-checked; an
// out-of-range one throws an IndexError naming the op, the index and the size.
#pragma once

#include "core/tensor.h"

namespace gw {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index: 1-D
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// A copy of x with src added at the positions index names along dim.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Rows of `weight` (num_embeddings, dim) picked by `indices` of any shape.
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor one_hot(const Tensor& indices, int64_t num_classes);

}  // namespace gw
