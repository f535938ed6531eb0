// Front end of the elementwise ops: dtype promotion, broadcasting, output allocation. The
// arithmetic itself is the device backend's (core/cpu/elementwise_kernels.cpp on CPU).
#include "core/ops/elementwise.h"

#include <cmath>
#include <numbers>

#include "core/autocast.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/reduce.h"

namespace gw {

namespace {

enum class Category { Bool, Integral, Floating };
Category category(DType t) {
  return t == kBool ? Category::Bool : is_floating(t) ? Category::Floating : Category::Integral;
}

// PyTorch's combine_categories: the operand group of higher priority (dimensioned tensors over
// 0-dim tensors over Scalars) keeps its dtype unless a lower group has a higher category.
DType combine(std::optional<DType> higher, DType lower) {
  if (!higher) return lower;
  if (category(*higher) == Category::Floating) return *higher;
  if (*higher == kBool || category(lower) == Category::Floating) {
    return promote_types(*higher, lower);
  }
  return *higher;
}

Tensor unary_op(UnaryOp op, const Tensor& x) {
  if (autocast_in_float32(op) && autocast_widens({&x})) return unary_op(op, autocast_widen(x));
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  const OpRule rule = op_rule(op);
  Tensor in = x;
  if (rule == OpRule::kFloat && !x.is_floating_point()) in = x.to(kFloat32);  // torch.exp(int)
  GW_CHECK(in.dtype() != kBool || rule == OpRule::kAll || rule == OpRule::kLogical, DTypeError, "[",
           op_name(op), "] is not supported for bool tensors");
  Tensor out =
      empty(in.sizes(), in.options().with_dtype(rule == OpRule::kLogical ? kBool : in.dtype()));
  backend_for(in, op_name(op)).unary(op, in, out);
  if (rec) rec->unary(op, x, out);
  return out;
}

// A 0-dim CPU tensor, which a binary op takes beside tensors of any device (as PyTorch does):
// wrapped Scalars are such tensors, so `x * 2` on a GPU allocates no device memory for the 2,
// and the device backend reads the value on the host and passes it to its kernel.
bool is_cpu_scalar(const Tensor& t) { return t.dim() == 0 && t.device().is_cpu(); }

// The device a binary op on a and b runs on, after the device check.
Device binary_device(const char* op, const Tensor& a, const Tensor& b) {
  if (is_cpu_scalar(b)) return a.device();
  if (is_cpu_scalar(a)) return b.device();
  check_same_device(op, {&a, &b});
  return a.device();
}

// A float32 CPU scalar beside 16-bit floats stays float32 in arithmetic: those kernels compute
// in float32 and read it as it is, as PyTorch's read a CPU scalar in their compute type
// (opmath), so that `x / 257` on a bfloat16 x divides by 257, where a bfloat16 257 would be
// 256. Comparisons take it rounded to the tensor's dtype, as PyTorch's do: eq(x, 0.1) holds for
// a bfloat16 x made from 0.1.
bool keeps_float32(BinaryOp op, const Tensor& t, DType compute) {
  return !is_comparison(op) && is_cpu_scalar(t) && t.dtype() == kFloat32 &&
         is_16_bit_float(compute);
}
// A binary kernel's operand: converted to `compute`, except such a scalar.
Tensor operand(BinaryOp op, const Tensor& t, DType compute) {
  return keeps_float32(op, t, compute) ? t : t.to(compute);
}

// Runs a binary kernel with both operands converted to `compute` and broadcast.
Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b, DType compute) {
  if (autocast_in_float32(op) && autocast_widens({&a, &b})) {
    return binary_op(op, autocast_widen(a), autocast_widen(b),
                     is_16_bit_float(compute) ? kFloat32 : compute);
  }
  const Device device = binary_device(op_name(op), a, b);
  // A CPU scalar that wants a gradient joins the device through a recorded copy, so that its
  // gradient comes back to the CPU.
  for (const Tensor* t : {&a, &b}) {
    if (is_cpu_scalar(*t) && t->requires_grad() && !device.is_cpu()) {
      return binary_op(op, t == &a ? a.to(device) : a, t == &b ? b.to(device) : b, compute);
    }
  }
  GradRecorder* rec = detail::recorder_for({&a, &b});
  detail::NoRecordScope no_record;
  const bool same_shape = a.sizes() == b.sizes();
  Shape shape = same_shape ? a.sizes() : broadcast_shapes(a.sizes(), b.sizes(), op_name(op));
  Tensor x = operand(op, a, compute), y = operand(op, b, compute);
  if (!same_shape) {
    x = x.expand(shape);
    y = y.expand(shape);
  }
  Tensor out = empty(std::move(shape),
                     TensorOptions(is_comparison(op) ? kBool : compute).with_device(device));
  backend_for(device.type, op_name(op)).binary(op, x, y, out);
  if (rec) rec->binary(op, a, b, out);
  return out;
}

// A Scalar as a 0-dim tensor; it takes part in promotion as a "wrapped number". Binary ops
// take it on the CPU whatever the other operand's device (is_cpu_scalar); `where` and
// masked_fill get it on their device.
Tensor wrap(const Scalar& s, DType dtype, Device device = kCPU) {
  return full({}, s, TensorOptions(dtype).with_device(device));
}
// A number as an arithmetic op's operand when the op computes in `compute`: float32 beside
// 16-bit floats (keeps_float32), `compute` otherwise.
Tensor wrap_number(const Scalar& s, DType compute) {
  return wrap(s, is_16_bit_float(compute) ? kFloat32 : compute);
}

// In-place binary op: the result must fit self's dtype and shape. With `alpha` (Add only),
// self += alpha * other in one pass.
Tensor& binary_inplace(BinaryOp op, Tensor& self, const Tensor& other,
                       const Scalar* alpha = nullptr) {
  if (!is_cpu_scalar(other)) check_same_device(op_name(op), {&self, &other});
  detail::check_inplace_allowed(self, (std::string(op_name(op)) + "_").c_str());
  DType rt = result_type(self, other);
  GW_CHECK(category(rt) <= category(self.dtype()), DTypeError, "[", op_name(op),
           "_] result type ", rt, " can't be cast to the in-place output type ", self.dtype());
  check_writable((std::string(op_name(op)) + "_").c_str(), self);
  GW_CHECK(!detail::recorder_for(other), InvalidArgumentError, "[", op_name(op),
           "_] an in-place op records no gradient, and the other operand requires grad; use the "
           "out-of-place op, or run it under NoGradGuard");
  Tensor y = alpha ? other.to(self.dtype()) : operand(op, other, self.dtype());
  // add_scaled takes operands on self's device only (binary takes a CPU scalar as well).
  if (alpha && !(y.device() == self.device())) y = y.to(self.device());
  if (y.sizes() != self.sizes()) {
    Shape shape = broadcast_shapes(self.sizes(), y.sizes(), op_name(op));
    GW_CHECK(shape == self.sizes(), ShapeError, "[", op_name(op), "_] output of shape ",
             shape_str(self.sizes()), " does not match the broadcast shape ", shape_str(shape));
    y = y.expand(shape);
  }
  if (y.storage() == self.storage() && !y.same(self)) y = y.clone();  // overlapping views
  if (alpha) {
    GW_CHECK(self.is_floating_point() || !alpha->is_floating(), DTypeError, "[", op_name(op),
             "_] alpha ", *alpha, " must be an integer for ", self.dtype(), " tensors");
    backend_for(self, op_name(op)).add_scaled(self, y, *alpha, self);
  } else {
    backend_for(self, op_name(op)).binary(op, self, y, self);
  }
  self.bump_version();
  return self;
}

DType division_type(DType t) { return is_floating(t) ? t : kFloat32; }

Scalar neg_scalar(const Scalar& s) {
  return s.is_floating() ? Scalar(-s.to_double()) : Scalar(-s.to<int64_t>());
}

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  std::optional<DType> dim_result, zero_result;
  for (const Tensor* t : {&a, &b}) {
    auto& slot = t->dim() > 0 ? dim_result : zero_result;
    slot = slot ? promote_types(*slot, t->dtype()) : t->dtype();
  }
  if (!zero_result) return *dim_result;
  return combine(dim_result, *zero_result);
}

DType result_type(const Tensor& a, const Scalar& b) {
  std::optional<DType> dim_result, zero_result;
  (a.dim() > 0 ? dim_result : zero_result) = a.dtype();
  DType wrapped = b.default_dtype();  // float scalars count as the default dtype (float32)
  return combine(dim_result, combine(zero_result, wrapped));
}

// --- arithmetic -------------------------------------------------------------------------------

namespace {
// a + alpha * b in one pass; with history to record, or a CPU scalar beside a device tensor,
// it is the composite add(a, mul(b, alpha)).
Tensor add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  DType t = result_type(a, b);
  GW_CHECK(is_floating(t) || !alpha.is_floating(), DTypeError,
           "[add] alpha ", alpha, " must be an integer for ", t, " tensors");
  if (detail::recorder_for({&a, &b}) || t == kBool || !(a.device() == b.device())) {
    return binary_op(BinaryOp::Add, a, mul(b.to(t), alpha), t);  // alpha * b in t, as the kernel
  }
  check_same_device("add", {&a, &b});
  Shape shape = a.sizes() == b.sizes() ? a.sizes() : broadcast_shapes(a.sizes(), b.sizes(), "add");
  Tensor out = empty(shape, a.options().with_dtype(t));
  backend_for(a, "add").add_scaled(a.to(t).expand(shape), b.to(t).expand(shape), alpha, out);
  return out;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (alpha.to_double() != 1.0) return add_scaled(a, b, alpha);
  return binary_op(BinaryOp::Add, a, b, result_type(a, b));
}
Tensor add(const Tensor& a, const Scalar& b) {
  DType t = result_type(a, b);
  return binary_op(BinaryOp::Add, a, wrap_number(b, t), t);
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  GW_CHECK(a.dtype() != kBool || b.dtype() != kBool, DTypeError,
           "[sub] subtracting two bool tensors is not supported; use logical_xor");
  if (alpha.to_double() != 1.0) return add_scaled(a, b, neg_scalar(alpha));
  return binary_op(BinaryOp::Sub, a, b, result_type(a, b));
}
Tensor sub(const Tensor& a, const Scalar& b) {
  DType t = result_type(a, b);
  return binary_op(BinaryOp::Sub, a, wrap_number(b, t), t);
}
Tensor sub(const Scalar& a, const Tensor& b) {
  DType t = result_type(b, a);
  return binary_op(BinaryOp::Sub, wrap_number(a, t), b, t);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Mul, a, b, result_type(a, b));
}
Tensor mul(const Tensor& a, const Scalar& b) {
  DType t = result_type(a, b);
  return binary_op(BinaryOp::Mul, a, wrap_number(b, t), t);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Div, a, b, division_type(result_type(a, b)));
}
Tensor div(const Tensor& a, const Scalar& b) {
  DType t = division_type(result_type(a, b));
  return binary_op(BinaryOp::Div, a, wrap_number(b, t), t);
}
Tensor pow(const Tensor& a, const Tensor& exponent) {
  return binary_op(BinaryOp::Pow, a, exponent, result_type(a, exponent));
}
Tensor pow(const Tensor& a, const Scalar& exponent) {
  if (autocast_widens({&a})) return pow(autocast_widen(a), exponent);  // before square's branch
  DType t = result_type(a, exponent);
  if (exponent.to_double() == 2.0 && is_floating(t)) return square(a.to(t));
  return binary_op(BinaryOp::Pow, a, wrap_number(exponent, t), t);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Maximum, a, b, result_type(a, b));
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Minimum, a, b, result_type(a, b));
}

namespace {
Tensor& binary_out(BinaryOp op, Tensor& out, const Tensor& a, const Tensor& b) {
  check_same_device(op_name(op), {&a, &b, &out});
  Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op_name(op));
  GW_CHECK(shape == out.sizes(), ShapeError, "[", op_name(op), "_out] out has shape ",
           shape_str(out.sizes()), " but the result has shape ", shape_str(shape));
  DType t = result_type(a, b);
  GW_CHECK(t == out.dtype(), DTypeError, "[", op_name(op), "_out] out has dtype ", out.dtype(),
           " but the result has dtype ", t);
  GW_CHECK(!detail::recorder_for({&a, &b, &out}), InvalidArgumentError, "[", op_name(op),
           "_out] out= variants do not record gradients; use ", op_name(op), "()");
  check_writable((std::string(op_name(op)) + "_out").c_str(), out);
  // An input that shares memory with out, other than as out itself, is read before it is written.
  auto apart = [&out](const Tensor& x) {
    return x.storage() == out.storage() && !x.same(out) ? x.clone() : x;
  };
  backend_for(a, op_name(op))
      .binary(op, apart(a.to(t)).expand(shape), apart(b.to(t)).expand(shape), out);
  out.bump_version();
  return out;
}
}  // namespace

Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Add, out, a, b);
}
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b) {
  return binary_out(BinaryOp::Mul, out, a, b);
}

// --- unary ------------------------------------------------------------------------------------

#define GW_UNARY_FN(Enum, name) \
  Tensor name(const Tensor& x) { return unary_op(UnaryOp::Enum, x); }
GW_FOR_EACH_UNARY_FN
#undef GW_UNARY_FN
Tensor gelu(const Tensor& x, std::string_view approximate) {
  GW_CHECK(approximate == "none" || approximate == "tanh", InvalidArgumentError,
           "[gelu] approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  return unary_op(approximate == "none" ? UnaryOp::Gelu : UnaryOp::GeluTanh, x);
}

// Each unary op's derivative: d op(x)/dx * g, from x and y = op(x). A missing op fails the build.
Tensor unary_derivative(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y) {
  // One pass where the backend fuses it, unless this derivative is itself recorded (a double
  // backward differentiates the composition below).
  Backend& backend = backend_for(x, op_name(op));
  if (backend.has_fused_unary_backward(op) && g.sizes() == x.sizes() && g.dtype() == x.dtype() &&
      g.device() == x.device() && !detail::recorder_for({&g, &x})) {
    Tensor out = empty(x.sizes(), x.options());
    backend.unary_backward(op, g, x, out);
    return out;
  }
  switch (op) {
    case UnaryOp::Neg:
      return neg(g);
    case UnaryOp::Abs:
      return mul(g, sign(x));
    case UnaryOp::Exp:
      return mul(g, y);
    case UnaryOp::Log:
      return div(g, x);
    case UnaryOp::Log1p:
      return div(g, add(x, 1));
    case UnaryOp::Expm1:
      return mul(g, add(y, 1));
    case UnaryOp::Sqrt:
      return div(g, mul(y, 2));
    case UnaryOp::Rsqrt:
      return mul(g, mul(pow(y, 3), -0.5));
    case UnaryOp::Square:
      return mul(g, mul(x, 2));
    case UnaryOp::Reciprocal:
      return neg(mul(g, square(y)));
    case UnaryOp::Sin:
      return mul(g, cos(x));
    case UnaryOp::Cos:
      return neg(mul(g, sin(x)));
    case UnaryOp::Sigmoid:
      return mul(g, mul(y, sub(1, y)));
    case UnaryOp::Tanh:
      return mul(g, sub(1, square(y)));
    case UnaryOp::Relu:
      return where(gt(y, 0), g, Scalar(0.0));
    case UnaryOp::Gelu: {  // d/dx x·Φ(x) = Φ(x) + x·φ(x)
      Tensor cdf = mul(add(erf(mul(x, std::numbers::sqrt2 / 2)), 1), 0.5);
      Tensor pdf = mul(exp(mul(square(x), -0.5)), 1 / std::sqrt(2 * std::numbers::pi));
      return mul(g, add(cdf, mul(x, pdf)));
    }
    case UnaryOp::GeluTanh: {
      constexpr double k = 0.7978845608028654, c = 0.044715;
      Tensor t = tanh(mul(add(x, mul(pow(x, 3), c)), k));
      Tensor dt = mul(sub(1, square(t)), mul(add(mul(square(x), 3 * c), 1), k));
      return mul(g, add(mul(add(t, 1), 0.5), mul(mul(x, dt), 0.5)));
    }
    case UnaryOp::Erf:
      return mul(g, mul(exp(neg(square(x))), 2 / std::sqrt(std::numbers::pi)));
    case UnaryOp::Silu: {  // d/dx x·σ(x) = σ(x)·(1 + x·(1 - σ(x)))
      Tensor s = sigmoid(x);
      return mul(g, mul(s, add(mul(x, sub(1, s)), 1)));
    }
    case UnaryOp::Sign:  // zero almost everywhere
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Round:
    case UnaryOp::LogicalNot:
      return zeros_like(x);
  }
  throw InternalError(detail::str("[autograd] no derivative for unary op ", int(op)));
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  GW_CHECK(min || max, InvalidArgumentError, "[clamp] at least one of min and max is required");
  DType t = x.dtype();
  if (min) t = promote_types(t, result_type(x, *min));  // clamp(int_tensor, 0.5) is float
  if (max) t = promote_types(t, result_type(x, *max));
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor in = x.to(t);
  Tensor out = empty(in.sizes(), in.options());
  backend_for(in, "clamp").clamp(in, min, max, out);
  if (rec) rec->clamp(x, min, max, out);
  return out;
}

// --- comparisons and logic --------------------------------------------------------------------

#define GW_COMPARISON(name, Op)                              \
  Tensor name(const Tensor& a, const Tensor& b) {            \
    return binary_op(BinaryOp::Op, a, b, result_type(a, b)); \
  }                                                          \
  Tensor name(const Tensor& a, const Scalar& b) {            \
    DType t = result_type(a, b);                             \
    return binary_op(BinaryOp::Op, a, wrap(b, t), t);        \
  }
GW_COMPARISON(eq, Eq)
GW_COMPARISON(ne, Ne)
GW_COMPARISON(lt, Lt)
GW_COMPARISON(le, Le)
GW_COMPARISON(gt, Gt)
GW_COMPARISON(ge, Ge)
#undef GW_COMPARISON

Tensor logical_and(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::LogicalAnd, a, b, result_type(a, b));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::LogicalOr, a, b, result_type(a, b));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  GW_CHECK(cond.dtype() == kBool, DTypeError, "[where] condition must be bool, got ",
           cond.dtype());
  // A CPU scalar operand (a wrapped number, or a comparison of one) joins the others' device.
  const Tensor* on = nullptr;
  for (const Tensor* t : {&cond, &a, &b}) {
    if (!on && !is_cpu_scalar(*t)) on = t;
  }
  if (on && !on->device().is_cpu() &&
      (is_cpu_scalar(cond) || is_cpu_scalar(a) || is_cpu_scalar(b))) {
    auto moved = [&](const Tensor& t) { return is_cpu_scalar(t) ? t.to(on->device()) : t; };
    return where(moved(cond), moved(a), moved(b));
  }
  check_same_device("where", {&cond, &a, &b});
  Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(),
                                 "where");
  DType t = result_type(a, b);
  GradRecorder* rec = detail::recorder_for({&a, &b});
  detail::NoRecordScope no_record;
  Tensor out = empty(shape, a.options().with_dtype(t));
  backend_for(a, "where").where(cond.expand(shape), a.to(t).expand(shape),
                                b.to(t).expand(shape), out);
  if (rec) rec->where(cond, a, b, out);
  return out;
}
Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b) {
  DType t = result_type(b, a);
  return where(cond, wrap(a, t, b.device()), b.to(t));
}
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b) {
  DType t = result_type(a, b);
  return where(cond, a.to(t), wrap(b, t, a.device()));
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value) {
  GW_CHECK(mask.dtype() == kBool, DTypeError, "[masked_fill] mask must be bool, got ",
           mask.dtype());
  return where(mask, wrap(value, x.dtype(), x.device()), x);
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "allclose");
  std::vector<double> x = a.expand(shape).to_vector<double>();
  std::vector<double> y = b.expand(shape).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // also equal infinities
    if (std::isinf(x[i]) || std::isinf(y[i])) return false;  // inf is close only to itself
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.to_vector<double>() == b.to_vector<double>();
}

// --- operators --------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Scalar& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Scalar& a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Scalar& a, const Tensor& b) {
  DType t = division_type(result_type(b, a));
  // The compute type given, as sub(Scalar, Tensor) does: div(Tensor, Tensor) would promote the
  // float32 number with a 0-dim 16-bit b, and 2 / bf16(3) would come back float32.
  return binary_op(BinaryOp::Div, wrap_number(a, t), b, t);
}
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor& operator+=(Tensor& a, const Tensor& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Tensor& b) { return a.div_(b); }
Tensor& operator+=(Tensor& a, const Scalar& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Scalar& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Scalar& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Scalar& b) { return a.div_(b); }

// --- in-place methods of Tensor -----------------------------------------------------------------

Tensor& Tensor::add_(const Tensor& other, const Scalar& alpha) {
  if (alpha.to_double() == 1.0) return binary_inplace(BinaryOp::Add, *this, other);
  return binary_inplace(BinaryOp::Add, *this, other, &alpha);
}
Tensor& Tensor::add_(const Scalar& other) {
  return binary_inplace(BinaryOp::Add, *this, wrap_number(other, result_type(*this, other)));
}
Tensor& Tensor::sub_(const Tensor& other, const Scalar& alpha) {
  if (alpha.to_double() == 1.0) return binary_inplace(BinaryOp::Sub, *this, other);
  Scalar negated = neg_scalar(alpha);
  return binary_inplace(BinaryOp::Add, *this, other, &negated);
}
Tensor& Tensor::sub_(const Scalar& other) {
  return binary_inplace(BinaryOp::Sub, *this, wrap_number(other, result_type(*this, other)));
}
Tensor& Tensor::mul_(const Tensor& other) { return binary_inplace(BinaryOp::Mul, *this, other); }
Tensor& Tensor::mul_(const Scalar& other) {
  return binary_inplace(BinaryOp::Mul, *this, wrap_number(other, result_type(*this, other)));
}
Tensor& Tensor::div_(const Tensor& other) {
  GW_CHECK(is_floating_point(), DTypeError, "[div_] true division cannot write into a ",
           dtype(), " tensor");
  return binary_inplace(BinaryOp::Div, *this, other);
}
Tensor& Tensor::div_(const Scalar& other) {
  GW_CHECK(is_floating_point(), DTypeError, "[div_] true division cannot write into a ",
           dtype(), " tensor");
  return binary_inplace(BinaryOp::Div, *this, wrap_number(other, dtype()));
}

Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  detail::check_inplace_allowed(*this, "clamp_");
  check_writable("clamp_", *this);
  Tensor clamped = clamp(*this, min, max);  // int clamped by 0.5 is float: not into an int
  GW_CHECK(clamped.dtype() == dtype(), DTypeError, "[clamp_] result type ", clamped.dtype(),
           " can't be cast to the in-place output type ", dtype());
  return copy_(clamped);
}

Tensor& Tensor::masked_fill_(const Tensor& mask, const Scalar& value) {
  check_same_device("masked_fill_", {this, &mask});
  detail::check_inplace_allowed(*this, "masked_fill_");
  GW_CHECK(mask.dtype() == kBool, DTypeError, "[masked_fill_] mask must be bool, got ",
           mask.dtype());
  Shape shape = broadcast_shapes(sizes(), mask.sizes(), "masked_fill_");
  GW_CHECK(shape == sizes(), ShapeError, "[masked_fill_] mask of shape ",
           shape_str(mask.sizes()), " does not broadcast to ", shape_str(sizes()));
  backend_for(*this, "masked_fill_")
      .where(mask.expand(shape), wrap(value, dtype(), device()).expand(shape), *this, *this);
  bump_version();
  return *this;
}

}  // namespace gw
