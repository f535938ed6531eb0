// Elementwise operations. Binary ops broadcast their inputs and promote dtypes like PyTorch
// (a 0-dim tensor or a Scalar only raises the category — bool < integer < floating — never
// the width: int32_tensor + 2 is int32, float32_tensor + double_0dim is float32). Division and
// the transcendental functions of integer inputs produce float32.
#pragma once

#include <optional>

#include "core/backend.h"
#include "core/tensor.h"

namespace gw {

// The dtype PyTorch would compute `a op b` in.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& b);

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);  // a + alpha * b
Tensor add(const Tensor& a, const Scalar& b);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b);
Tensor sub(const Scalar& a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Scalar& b);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(const Tensor& a, const Scalar& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// The same, writing into an existing tensor whose shape is the broadcast shape.
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b);

// The unary ops core/op_list.h marks `fn`, one function each: Tensor neg(const Tensor& x), abs,
// exp, log, sqrt, rsqrt, sigmoid, tanh, relu, sin, cos, sign, logical_not, square, reciprocal,
// log1p, expm1, floor, ceil, round, erf, ...
#define GW_UNARY_FN(Enum, name) Tensor name(const Tensor& x);
GW_FOR_EACH_UNARY_FN
#undef GW_UNARY_FN
// approximate: "none" (exact, erf) or "tanh", as in torch.nn.functional.gelu.
Tensor gelu(const Tensor& x, std::string_view approximate = "none");
// The derivative of a unary op times the incoming gradient g, given its input x and output
// y = op(x): what autograd's node for the op returns. Each op's rule sits beside its forward
// (core/ops/elementwise.cpp).
Tensor unary_derivative(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);

// Comparisons and logic produce bool tensors.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

// cond ? a : b, broadcasting all three; cond must be bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value);

// True when every element is within atol + rtol * |b| (NaNs unequal); shapes must broadcast.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// Same shape and same values.
bool equal(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Scalar& b);
Tensor& operator-=(Tensor& a, const Scalar& b);
Tensor& operator*=(Tensor& a, const Scalar& b);
Tensor& operator/=(Tensor& a, const Scalar& b);

}  // namespace gw
