// Front end of reductions: dim normalization, keepdim shapes, output dtypes. var, std and
// logsumexp are compositions of the primitive reductions.
#include "core/ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/elementwise.h"

namespace gw {

namespace {

// Which dims a reduction over `dims` touches; an empty list means all dims (as in PyTorch).
std::vector<bool> reduced_mask(const Tensor& x, const Shape& dims, const char* op) {
  std::vector<bool> mask(x.dim(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;  // a 0-dim tensor reduces over dim 0/-1 to itself
    GW_CHECK(!mask[w] || dims.empty(), InvalidArgumentError, "[", op, "] dim ", d,
             " appears more than once in ", shape_str(dims));
    mask[w] = true;
  }
  return mask;
}

Tensor reduce_dims(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim, DType out_dtype,
                   const char* name) {
  if ((op == ReduceOp::Sum || op == ReduceOp::Prod) && autocast_widens({&x})) {  // float32 out
    return reduce_dims(op, autocast_widen(x), dims, keepdim, kFloat32, name);
  }
  std::vector<bool> mask = reduced_mask(x, dims, name);
  Shape kept_shape = x.sizes(), out_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (mask[d]) {
      if (op == ReduceOp::Max || op == ReduceOp::Min) {
        GW_CHECK(x.size(d) > 0, ShapeError, "[", name, "] cannot reduce over dim ", d,
                 " of size 0 (shape ", shape_str(x.sizes()), ")");
      }
      kept_shape[d] = 1;
    } else {
      out_shape.push_back(x.size(d));
    }
  }
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor out = empty(kept_shape, x.options().with_dtype(out_dtype));
  backend_for(x, name).reduce(op, x, out);
  if (!keepdim) out = out.view(out_shape);
  if (rec) {
    Shape reduced;
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (mask[d]) reduced.push_back(d);
    }
    rec->reduce(op, x, reduced, keepdim, out);
  }
  return out;
}

DType sum_type(DType t) { return is_floating(t) ? t : kInt64; }

void check_floating(const Tensor& x, const char* op) {
  GW_CHECK(x.is_floating_point(), DTypeError, "[", op,
           "] needs a floating point input, got dtype ", x.dtype());
}

int64_t reduced_count(const Tensor& x, const Shape& dims, const char* op) {
  std::vector<bool> mask = reduced_mask(x, dims, op);
  int64_t n = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (mask[d]) n *= x.size(d);
  }
  return n;
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_dims(ReduceOp::Sum, x, {}, false, sum_type(x.dtype()), "sum"); }
Tensor sum(const Tensor& x, Shape dims, bool keepdim) {
  return reduce_dims(ReduceOp::Sum, x, dims, keepdim, sum_type(x.dtype()), "sum");
}
Tensor prod(const Tensor& x) { return reduce_dims(ReduceOp::Prod, x, {}, false, sum_type(x.dtype()), "prod"); }
Tensor prod(const Tensor& x, Shape dims, bool keepdim) {
  return reduce_dims(ReduceOp::Prod, x, dims, keepdim, sum_type(x.dtype()), "prod");
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }
// mean and var of 16-bit floats outside autocast: the sums and the division in float32 with
// one rounding at the end, as PyTorch's kernels compute them (a bfloat16 sum of 257 ones would
// round to 256 before the division). Under autocast the sums are float32 anyway, and so is the
// result.
namespace {
bool in_float32_first(const Tensor& x) {
  return is_16_bit_float(x.dtype()) && !autocast_widens({&x});
}
}  // namespace

Tensor mean(const Tensor& x, Shape dims, bool keepdim) {
  check_floating(x, "mean");
  if (in_float32_first(x)) return mean(x.to(kFloat32), std::move(dims), keepdim).to(x.dtype());
  int64_t n = reduced_count(x, dims, "mean");
  return div(sum(x, dims, keepdim), Scalar(static_cast<double>(n)));
}

Tensor max(const Tensor& x) { return reduce_dims(ReduceOp::Max, x, {}, false, x.dtype(), "max"); }
Tensor min(const Tensor& x) { return reduce_dims(ReduceOp::Min, x, {}, false, x.dtype(), "min"); }
Tensor amax(const Tensor& x, Shape dims, bool keepdim) {
  return reduce_dims(ReduceOp::Max, x, dims, keepdim, x.dtype(), "amax");
}
Tensor amin(const Tensor& x, Shape dims, bool keepdim) {
  return reduce_dims(ReduceOp::Min, x, dims, keepdim, x.dtype(), "amin");
}

namespace {
ValuesIndices extreme_along(ReduceOp op, const Tensor& x_in, int64_t dim, bool keepdim,
                            const char* name) {
  if (x_in.dim() == 0) {  // along dim 0 of a scalar: the value itself, index 0
    wrap_dim(dim, 0, name);
    return {op == ReduceOp::Max ? amax(x_in, {}) : amin(x_in, {}),
            zeros({}, x_in.options().with_dtype(kInt64))};
  }
  const Tensor& x = x_in;
  int64_t d = wrap_dim(dim, x.dim(), name);
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  GW_CHECK(x.size(d) > 0, ShapeError, "[", name, "] cannot reduce over dim ", dim,
           " of size 0 (shape ", shape_str(x.sizes()), ")");
  Shape out_shape = x.sizes();
  out_shape.erase(out_shape.begin() + d);
  ValuesIndices r{empty(out_shape, x.options()), empty(out_shape, x.options().with_dtype(kInt64))};
  backend_for(x, name).reduce_with_index(op, x, d, r.values, r.indices);
  if (keepdim) {
    r.values = r.values.unsqueeze(d);
    r.indices = r.indices.unsqueeze(d);
  }
  if (rec) rec->reduce_with_index(x, d, keepdim, r.values, r.indices);
  return r;
}
}  // namespace

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(ReduceOp::Max, x, dim, keepdim, "max");
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(ReduceOp::Min, x, dim, keepdim, "min");
}
Tensor argmax(const Tensor& x) { return extreme_along(ReduceOp::Max, x.reshape({-1}), 0, false, "argmax").indices; }
Tensor argmin(const Tensor& x) { return extreme_along(ReduceOp::Min, x.reshape({-1}), 0, false, "argmin").indices; }
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(ReduceOp::Max, x, dim, keepdim, "argmax").indices;
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(ReduceOp::Min, x, dim, keepdim, "argmin").indices;
}

Tensor var(const Tensor& x, Shape dims, int64_t correction, bool keepdim) {
  check_floating(x, "var");
  if (in_float32_first(x))
    return var(x.to(kFloat32), std::move(dims), correction, keepdim).to(x.dtype());
  int64_t n = reduced_count(x, dims, "var");
  Tensor centered = sub(x, mean(x, dims, true));
  // PyTorch returns inf/nan when n <= correction rather than raising.
  double denom = static_cast<double>(std::max<int64_t>(n - correction, 0));
  return div(sum(square(centered), dims, keepdim), Scalar(denom));
}
Tensor std(const Tensor& x, Shape dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, std::move(dims), correction, keepdim));
}

Tensor logsumexp(const Tensor& x, Shape dims, bool keepdim) {
  check_floating(x, "logsumexp");
  if (autocast_widens({&x})) return logsumexp(autocast_widen(x), std::move(dims), keepdim);
  Tensor m = amax(x, dims, true);
  // Rows of -inf (or +inf) would give inf - inf: shift those by 0 instead.
  Tensor shift = where(eq(abs(m), std::numeric_limits<double>::infinity()), Scalar(0.0), m);
  Tensor r = add(log(sum(exp(sub(x, shift)), dims, true)), shift);
  if (keepdim) return r;
  std::vector<bool> mask = reduced_mask(x, dims, "logsumexp");
  Shape out_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!mask[d]) out_shape.push_back(x.size(d));
  }
  return r.view(out_shape);
}

namespace {
Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_floating(x, name);
  if (autocast_widens({&x})) return softmax_impl(autocast_widen(x), dim, log);
  if (x.dim() == 0) return softmax_impl(x.reshape({1}), dim, log).reshape({});
  int64_t d = wrap_dim(dim, x.dim(), name);
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor out = empty(x.sizes(), x.options());
  backend_for(x, name).softmax(x, d, log, out);
  if (rec) rec->softmax(x, d, log, out);
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

}  // namespace gw
