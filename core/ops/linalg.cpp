#include "core/ops/linalg.h"

#include "core/autocast.h"
#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/elementwise.h"

namespace gw {

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  GW_CHECK(a.dtype() == b.dtype(), DTypeError, "[", op, "] expected operands of one dtype, got ",
           a.dtype(), " and ", b.dtype());
  GW_CHECK(a.dtype() != kBool, DTypeError, "[", op, "] is not supported for bool tensors");
  check_same_device(op, {&a, &b});
}

// (B,n,k) @ (B,k,m) with the batch dims already equal, or (n,k) @ (k,m).
Tensor bmm_unchecked(const Tensor& a, const Tensor& b) {
  GradRecorder* rec = detail::recorder_for({&a, &b});
  detail::NoRecordScope no_record;
  Shape shape = a.sizes();
  shape.back() = b.sizes().back();
  Tensor out = empty(std::move(shape), a.options());
  backend_for(a, "matmul").bmm(a, b, out);
  if (rec) rec->matmul(a, b, out);
  return out;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (autocast_lowers({&a, &b})) return mm(autocast_lower(a), autocast_lower(b));
  check_operands("mm", a, b);
  GW_CHECK(a.dim() == 2 && b.dim() == 2, ShapeError, "[mm] expects two matrices, got shapes ",
           shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  GW_CHECK(a.size(1) == b.size(0), ShapeError, "[mm] shapes ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()), " cannot be multiplied");
  return bmm_unchecked(a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (autocast_lowers({&a, &b})) return bmm(autocast_lower(a), autocast_lower(b));
  check_operands("bmm", a, b);
  GW_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "[bmm] expects two 3-D tensors, got shapes ",
           shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  GW_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), ShapeError, "[bmm] shapes ",
           shape_str(a.sizes()), " and ", shape_str(b.sizes()), " cannot be multiplied");
  return bmm_unchecked(a, b);
}

Tensor dot(const Tensor& a, const Tensor& b) {
  check_operands("dot", a, b);
  GW_CHECK(a.dim() == 1 && b.dim() == 1 && a.size(0) == b.size(0), ShapeError,
           "[dot] expects two 1-D tensors of one size, got shapes ", shape_str(a.sizes()),
           " and ", shape_str(b.sizes()));
  return bmm_unchecked(a.view({1, 1, -1}), b.view({1, -1, 1})).reshape({});
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast_lowers({&a, &b})) return matmul(autocast_lower(a), autocast_lower(b));
  check_operands("matmul", a, b);
  GW_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError,
           "[matmul] both arguments need at least 1 dim, got shapes ", shape_str(a.sizes()),
           " and ", shape_str(b.sizes()));
  if (a.dim() == 1 && b.dim() == 1) return dot(a, b);
  if (a.dim() <= 2 && b.dim() <= 2) {
    Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
    GW_CHECK(a2.size(1) == b2.size(0), ShapeError, "[matmul] shapes ", shape_str(a.sizes()),
             " and ", shape_str(b.sizes()), " cannot be multiplied");
    Tensor r = mm(a2, b2);
    if (a.dim() == 1) r = r.squeeze(0);
    if (b.dim() == 1) r = r.squeeze(-1);
    return r;
  }
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t n = a2.size(-2), k = a2.size(-1), m = b2.size(-1);
  GW_CHECK(k == b2.size(-2), ShapeError, "[matmul] shapes ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()), " cannot be multiplied");
  Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2);
  Shape batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(n);
  out_shape.push_back(m);
  Tensor r;
  if (b2.dim() == 2 && a2.is_contiguous()) {
    // (..., n, k) @ (k, m): fold the batch into the rows, one large GEMM.
    r = mm(a2.reshape({numel(batch_a) * n, k}), b2).view(out_shape);
  } else {
    const int64_t batch_n = numel(batch);
    Shape ea = batch, eb = batch;
    ea.insert(ea.end(), {n, k});
    eb.insert(eb.end(), {k, m});
    r = bmm_unchecked(a2.expand(ea).reshape({batch_n, n, k}), b2.expand(eb).reshape({batch_n, k, m}))
            .view(out_shape);
  }
  if (a.dim() == 1) r = r.squeeze(-2);
  if (b.dim() == 1) r = r.squeeze(-1);
  return r;
}

std::optional<std::pair<Tensor, Tensor>> detail::mm_and_row_sums(const Tensor& a, const Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || !a.is_floating_point() ||
      a.dtype() != b.dtype() || a.device() != b.device())
    return std::nullopt;
  detail::NoRecordScope no_record;
  Tensor out = empty({a.size(0), b.size(1)}, a.options());
  Tensor sums = empty({a.size(0)}, a.options());
  if (!backend_for(a, "mm").mm_row_sums(a, b, out, sums)) return std::nullopt;
  return std::pair{out, sums};
}

Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b) {
  if (autocast_lowers({&input, &a, &b}))
    return addmm(autocast_lower(input), autocast_lower(a), autocast_lower(b));
  check_operands("addmm", a, b);
  GW_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), ShapeError,
           "[addmm] expects matrices (n,k) and (k,m), got shapes ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()));
  const Shape shape = {a.size(0), b.size(1)};
  GW_CHECK(input.defined() && input.dim() <= 2 &&
               broadcast_shapes(input.sizes(), shape, "addmm") == shape,
           ShapeError, "[addmm] input of shape ",
           input.defined() ? shape_str(input.sizes()) : "(undefined)",
           " does not broadcast to the product's ", shape_str(shape));
  Backend& backend = backend_for(a, "addmm");
  if (!backend.has_fused_addmm() || !a.is_floating_point() || input.dtype() != a.dtype() ||
      input.device() != a.device()) {
    return add(mm(a, b), input);
  }
  GradRecorder* rec = detail::recorder_for({&input, &a, &b});
  detail::NoRecordScope no_record;
  Tensor out = empty(shape, a.options());
  backend.addmm(input, a, b, out);
  if (rec) rec->addmm(input, a, b, out);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_lowers({&x, &weight, &bias}))
    return linear(autocast_lower(x), autocast_lower(weight), autocast_lower(bias));
  GW_CHECK(weight.dim() == 2, ShapeError, "[linear] weight must be 2-D, got shape ",
           shape_str(weight.sizes()));
  if (bias.defined() && x.dim() >= 2 && x.is_contiguous() && bias.dim() == 1 &&
      x.size(-1) == weight.size(1)) {
    // (..., in) as rows of one matrix: one GEMM that starts from the bias (torch's addmm).
    Shape shape = x.sizes();
    shape.back() = weight.size(0);
    const int64_t rows = numel(Shape(x.sizes().begin(), x.sizes().end() - 1));  // -1 cannot
    return addmm(bias, x.reshape({rows, x.size(-1)}), weight.t()).view(shape);  // infer 0 wide
  }
  Tensor y = matmul(x, weight.t());
  return bias.defined() ? add(y, bias) : y;
}

}  // namespace gw
