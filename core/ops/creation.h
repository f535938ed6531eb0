// Tensor creation: constant fills, ranges, identity, and the *_like forms.
#pragma once

#include "core/tensor.h"

namespace gw {

Tensor empty(Shape shape, TensorOptions options = {});
Tensor zeros(Shape shape, TensorOptions options = {});
Tensor ones(Shape shape, TensorOptions options = {});
Tensor full(Shape shape, const Scalar& value, TensorOptions options = {});
Tensor eye(int64_t n, TensorOptions options = {});
Tensor eye(int64_t n, int64_t m, TensorOptions options = {});

// Like PyTorch: integer bounds give int64, any floating bound gives float32, unless the options
// name a dtype explicitly.
Tensor arange(const Scalar& end);
Tensor arange(const Scalar& end, TensorOptions options);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions options);
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});

Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
Tensor empty_like(const Tensor& t, TensorOptions options);
Tensor zeros_like(const Tensor& t, TensorOptions options);
Tensor ones_like(const Tensor& t, TensorOptions options);

}  // namespace gw
