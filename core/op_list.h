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
// X(Enum, name, rule, fn): rule is
//   kFloat    floating only: an integer or bool input is promoted to float32 first (torch.exp);
//   kNumeric  any dtype but bool, computed in the input's;
//   kAll      any dtype, bool included;
//   kLogical  any dtype in, bool out.
// fn: `fn` declares and defines `Tensor name(const Tensor& x)`; `none` leaves the public
// function to hand (gelu takes an `approximate` argument and picks Gelu or GeluTanh).
#pragma once

// clang-format off
#define GW_UNARY_OPS(X)                     \
  X(Neg,        neg,         kNumeric, fn)  \
  X(Abs,        abs,         kAll,     fn)  \
  X(Exp,        exp,         kFloat,   fn)  \
  X(Log,        log,         kFloat,   fn)  \
  X(Sqrt,       sqrt,        kFloat,   fn)  \
  X(Rsqrt,      rsqrt,       kFloat,   fn)  \
  X(Sigmoid,    sigmoid,     kFloat,   fn)  \
  X(Tanh,       tanh,        kFloat,   fn)  \
  X(Relu,       relu,        kAll,     fn)  \
  X(Gelu,       gelu,        kFloat,   none)\
  X(GeluTanh,   gelu,        kFloat,   none)\
  X(Sin,        sin,         kFloat,   fn)  \
  X(Cos,        cos,         kFloat,   fn)  \
  X(Sign,       sign,        kNumeric, fn)  \
  X(LogicalNot, logical_not, kLogical, fn)  \
  X(Square,     square,      kNumeric, fn)  \
  X(Reciprocal, reciprocal,  kFloat,   fn)  \
  X(Log1p,      log1p,       kFloat,   fn)  \
  X(Expm1,      expm1,       kFloat,   fn)  \
  X(Floor,      floor,       kNumeric, fn)  \
  X(Ceil,       ceil,        kNumeric, fn)  \
  X(Round,      round,       kNumeric, fn)  \
  X(Erf,        erf,         kFloat,   fn)  \
  X(Silu,       silu,        kFloat,   fn)

// The unary ops marked `fn`: expands GW_UNARY_FN(Enum, name), which the includer defines (and
// undefines after), once for each.
#define GW_FOR_EACH_UNARY_FN GW_UNARY_OPS(GW_UNARY_FN_SELECT)
#define GW_UNARY_FN_SELECT(Enum, name, rule, fn) GW_UNARY_FN_SELECT_##fn(Enum, name)
#define GW_UNARY_FN_SELECT_fn(Enum, name) GW_UNARY_FN(Enum, name)
#define GW_UNARY_FN_SELECT_none(Enum, name)

// Binary ops take two tensors (or a tensor and a Scalar) of one computed dtype; their public
// functions, with their Scalar overloads and alpha, are written by hand (elementwise.h).
// rule: kArith (the computed dtype out), kCompare or kLogical (bool out).
#define GW_BINARY_OPS(X)                    \
  X(Add,        add,         kArith)        \
  X(Sub,        sub,         kArith)        \
  X(Mul,        mul,         kArith)        \
  X(Div,        div,         kArith)        \
  X(Pow,        pow,         kArith)        \
  X(Maximum,    maximum,     kArith)        \
  X(Minimum,    minimum,     kArith)        \
  X(Eq,         eq,          kCompare)      \
  X(Ne,         ne,          kCompare)      \
  X(Lt,         lt,          kCompare)      \
  X(Le,         le,          kCompare)      \
  X(Gt,         gt,          kCompare)      \
  X(Ge,         ge,          kCompare)      \
  X(LogicalAnd, logical_and, kLogical)      \
  X(LogicalOr,  logical_or,  kLogical)
// clang-format on
