// Derivative rules of the elementwise ops.
#include <cmath>
#include <numbers>

#include "autograd/functions/common.h"
#include "autograd/functions/recorder.h"

namespace gw::autograd {

namespace {

class UnaryBackward final : public Node {
 public:
  UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& out) : op_(op), x_(x), out_(out, /*is_output=*/true) {}
  std::string name() const override { return std::string(op_name(op_)) + "Backward"; }
  void release_variables() override {
    x_.reset();
    out_.reset();
  }

  // The rule is the op's own, beside its forward (core/ops/elementwise.cpp).
  TensorList apply(TensorList&& grads) override {
    Tensor x = x_.unpack(*this), y = out_.unpack(*this);
    return {unary_derivative(op_, grads[0], x, y).to(x.dtype())};
  }

 private:
  UnaryOp op_;
  SavedTensor x_, out_;
};

class BinaryBackward final : public Node {
 public:
  BinaryBackward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out)
      : op_(op),
        // Save only what the rule reads: add and sub need no values at all.
        a_(op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Div ? Tensor() : a),
        b_(op == BinaryOp::Add || op == BinaryOp::Sub ? Tensor() : b),
        out_(op == BinaryOp::Div || op == BinaryOp::Pow ? out : Tensor(), /*is_output=*/true),
        a_shape_(a.sizes()), b_shape_(b.sizes()), a_dtype_(a.dtype()), b_dtype_(b.dtype()) {}
  std::string name() const override { return std::string(op_name(op_)) + "Backward"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
    out_.reset();
  }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    const bool need_a = wants(*this, 0), need_b = wants(*this, 1);
    switch (op_) {
      case BinaryOp::Add:
        ga = g;
        gb = g;
        break;
      case BinaryOp::Sub:
        ga = g;
        if (need_b) gb = neg(g);
        break;
      case BinaryOp::Mul:
        if (need_a) ga = mul(g, b_.unpack(*this));
        if (need_b) gb = mul(g, a_.unpack(*this));
        break;
      case BinaryOp::Div: {
        Tensor b = b_.unpack(*this);
        if (need_a) ga = div(g, b);
        if (need_b) gb = neg(div(mul(g, out_.unpack(*this)), b));
        break;
      }
      case BinaryOp::Pow: {
        Tensor a = a_.unpack(*this), b = b_.unpack(*this);
        if (need_a) {
          // b * a^(b-1), taken as 0 where b == 0 (d/da a^0 = 0, even at a = 0)
          Tensor d = mul(b, pow(a, sub(b, 1)));
          ga = mul(g, where(eq(b, 0), Scalar(0.0), d));
        }
        if (need_b) {
          // a^b * log(a), taken as 0 where a == 0 and b >= 0 (the limit from the right)
          Tensor d = mul(out_.unpack(*this), log(a));
          gb = mul(g, where(logical_and(eq(a, 0), ge(b, 0)), Scalar(0.0), d));
        }
        break;
      }
      case BinaryOp::Maximum:
      case BinaryOp::Minimum: {
        // Ties split the gradient evenly, as in PyTorch.
        Tensor a = a_.unpack(*this), b = b_.unpack(*this);
        Tensor wins = op_ == BinaryOp::Maximum ? gt(a, b) : lt(a, b);
        Tensor half = mul(eq(a, b), 0.5);
        Tensor share_a = add(half, wins);
        if (need_a) ga = mul(g, share_a);
        if (need_b) gb = mul(g, sub(1, share_a));
        break;
      }
      case BinaryOp::Eq:  // bool results: the recorder never makes a node for them
      case BinaryOp::Ne:
      case BinaryOp::Lt:
      case BinaryOp::Le:
      case BinaryOp::Gt:
      case BinaryOp::Ge:
      case BinaryOp::LogicalAnd:
      case BinaryOp::LogicalOr:
        throw InternalError(detail::str("[backward] ", op_name(op_), " is not differentiable"));
    }
    return {ga.defined() && need_a ? sum_to(ga, a_shape_).to(a_dtype_) : Tensor(),
            gb.defined() && need_b ? sum_to(gb, b_shape_).to(b_dtype_) : Tensor()};
  }

 private:
  BinaryOp op_;
  SavedTensor a_, b_, out_;
  Shape a_shape_, b_shape_;
  DType a_dtype_, b_dtype_;
};

class WhereBackward final : public Node {
 public:
  WhereBackward(const Tensor& cond, const Tensor& a, const Tensor& b)
      : cond_(cond), a_shape_(a.sizes()), b_shape_(b.sizes()), a_dtype_(a.dtype()),
        b_dtype_(b.dtype()) {}
  std::string name() const override { return "WhereBackward"; }
  void release_variables() override { cond_.reset(); }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor cond = cond_.unpack(*this);
    Tensor ga, gb;
    if (wants(*this, 0)) ga = sum_to(where(cond, g, Scalar(0.0)), a_shape_).to(a_dtype_);
    if (wants(*this, 1)) gb = sum_to(where(cond, Scalar(0.0), g), b_shape_).to(b_dtype_);
    return {ga, gb};
  }

 private:
  SavedTensor cond_;
  Shape a_shape_, b_shape_;
  DType a_dtype_, b_dtype_;
};

class ClampBackward final : public Node {
 public:
  ClampBackward(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi)
      : x_(x), lo_(lo), hi_(hi) {}
  std::string name() const override { return "ClampBackward"; }
  void release_variables() override { x_.reset(); }
  TensorList apply(TensorList&& grads) override {
    Tensor x = x_.unpack(*this);
    Tensor pass = ones_like(x, x.options().with_dtype(kBool));
    if (lo_) pass = logical_and(pass, ge(x, *lo_));
    if (hi_) pass = logical_and(pass, le(x, *hi_));
    return {mul(grads[0], pass).to(x.dtype())};
  }

 private:
  SavedTensor x_;
  std::optional<Scalar> lo_, hi_;
};

bool differentiable(const Tensor& out) { return out.is_floating_point(); }

}  // namespace

void Recorder::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  if (!differentiable(out)) return;
  record<UnaryBackward>({&x}, out, op, x, out);
}

void Recorder::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (is_comparison(op) || !differentiable(out)) return;
  record<BinaryBackward>({&a, &b}, out, op, a, b, out);
}

void Recorder::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!differentiable(out)) return;
  record<WhereBackward>({&a, &b}, out, cond, a, b);
}

void Recorder::clamp(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi,
                     const Tensor& out) {
  if (!differentiable(out)) return;
  record<ClampBackward>({&x}, out, x, lo, hi);
}

}  // namespace gw::autograd
