// Reductions over all elements or over given dims (negative dims count from the end), with
// keepdim like PyTorch. Sums of integers and bools are int64; floating sums accumulate in
// double and are returned in the input dtype.
#pragma once

#include "core/tensor.h"

namespace gw {

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, Shape dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, Shape dims, bool keepdim = false);
Tensor prod(const Tensor& x);
Tensor prod(const Tensor& x, Shape dims, bool keepdim = false);
// Largest/smallest element (all dims), or over several dims without indices.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
Tensor amax(const Tensor& x, Shape dims, bool keepdim = false);
Tensor amin(const Tensor& x, Shape dims, bool keepdim = false);

// Values and int64 indices of the extremes along one dim (first occurrence on ties).
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // index into the flattened tensor
Tensor argmin(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

// Over `dims` (empty: all). correction = 1 is Bessel's correction (PyTorch's default,
// unbiased); var(x, {}, 0) is the biased variance of all elements.
Tensor var(const Tensor& x, Shape dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, Shape dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, Shape dims, bool keepdim = false);

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace gw
