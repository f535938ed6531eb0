// The elementwise ops, one line each: everything about an op that is not code.
//
// Mental model: an elementwise op is a line here plus three pieces of code, each a `case` of a
// switch over its enum that has no `default`, so that the build fails (-Werror=switch) until
// every piece exists:
//   - its value at one element on the CPU (core/cpu/elementwise_kernels.cpp) and on the GPU
//     (core/cuda/elementwise.cu);
//   - for a unary op, its derivative, next to its forward in core/ops/elementwise.cpp
//     (unary_derivative), which autograd's node calls.
// From this list come the UnaryOp and BinaryOp enums (core/backend.h), the names in errors and
// node names (op_name), which dtypes an op takes, and, for the unary ops marked `fn`, the
// function itself: `Tensor erf(const Tensor&)` (core/ops/elementwise.h). "Adding an op" in
// docs/developing.md walks through one.
//
// X(Enum, name, rule, fn, amp): rule is
//   kFloat    floating only: an integer or bool input is promoted to float32 first (torch.exp);
//   kNumeric  any dtype but bool, computed in the input's;
//   kAll      any dtype, bool included;
//   kLogical  any dtype in, bool out.
// fn: `fn` declares and defines `Tensor name(const Tensor& x)`; `none` leaves the public
// function to hand (gelu takes an `approximate` argument and picks Gelu or GeluTanh).
// amp: what the op does under autocast (core/autocast.h): `f32` computes a 16-bit input in
// float32, as torch.autocast's float32 list does; `same` keeps the input's dtype.
#pragma once

// clang-format off
#define GW_UNARY_OPS(X)                           \
  X(Neg,        neg,         kNumeric, fn,   same) \
  X(Abs,        abs,         kAll,     fn,   same) \
  X(Exp,        exp,         kFloat,   fn,   f32)  \
  X(Log,        log,         kFloat,   fn,   f32)  \
  X(Sqrt,       sqrt,        kFloat,   fn,   same) \
  X(Rsqrt,      rsqrt,       kFloat,   fn,   f32)  \
  X(Sigmoid,    sigmoid,     kFloat,   fn,   same) \
  X(Tanh,       tanh,        kFloat,   fn,   same) \
  X(Relu,       relu,        kAll,     fn,   same) \
  X(Gelu,       gelu,        kFloat,   none, same) \
  X(GeluTanh,   gelu,        kFloat,   none, same) \
  X(Sin,        sin,         kFloat,   fn,   same) \
  X(Cos,        cos,         kFloat,   fn,   same) \
  X(Sign,       sign,        kNumeric, fn,   same) \
  X(LogicalNot, logical_not, kLogical, fn,   same) \
  X(Square,     square,      kNumeric, fn,   same) \
  X(Reciprocal, reciprocal,  kFloat,   fn,   f32)  \
  X(Log1p,      log1p,       kFloat,   fn,   f32)  \
  X(Expm1,      expm1,       kFloat,   fn,   f32)  \
  X(Floor,      floor,       kNumeric, fn,   same) \
  X(Ceil,       ceil,        kNumeric, fn,   same) \
  X(Round,      round,       kNumeric, fn,   same) \
  X(Erf,        erf,         kFloat,   fn,   same) \
  X(Silu,       silu,        kFloat,   fn,   same)

// The unary ops marked `fn`: expands GW_UNARY_FN(Enum, name), which the includer defines (and
// undefines after), once for each.
#define GW_FOR_EACH_UNARY_FN GW_UNARY_OPS(GW_UNARY_FN_SELECT)
#define GW_UNARY_FN_SELECT(Enum, name, rule, fn, amp) GW_UNARY_FN_SELECT_##fn(Enum, name)
#define GW_UNARY_FN_SELECT_fn(Enum, name) GW_UNARY_FN(Enum, name)
#define GW_UNARY_FN_SELECT_none(Enum, name)

// Binary ops take two tensors (or a tensor and a Scalar) of one computed dtype; their public
// functions, with their Scalar overloads and alpha, are written by hand (elementwise.h).
// X(Enum, name, rule, amp), rule: kArith (the computed dtype out), kCompare or kLogical (bool
// out); amp as above.
#define GW_BINARY_OPS(X)                    \
  X(Add,        add,         kArith,   same) \
  X(Sub,        sub,         kArith,   same) \
  X(Mul,        mul,         kArith,   same) \
  X(Div,        div,         kArith,   same) \
  X(Pow,        pow,         kArith,   f32)  \
  X(Maximum,    maximum,     kArith,   same) \
  X(Minimum,    minimum,     kArith,   same) \
  X(Eq,         eq,          kCompare, same) \
  X(Ne,         ne,          kCompare, same) \
  X(Lt,         lt,          kCompare, same) \
  X(Le,         le,          kCompare, same) \
  X(Gt,         gt,          kCompare, same) \
  X(Ge,         ge,          kCompare, same) \
  X(LogicalAnd, logical_and, kLogical, same) \
  X(LogicalOr,  logical_or,  kLogical, same)
// clang-format on
