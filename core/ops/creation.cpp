#include "core/ops/creation.h"

#include <cmath>

#include "core/backend.h"
#include "core/grad_hooks.h"

namespace gw {

Tensor empty(Shape shape, TensorOptions options) {
  const int64_t nbytes = storage_nbytes(shape, itemsize(options.dtype), "empty");
  auto storage = Storage::allocate(static_cast<size_t>(nbytes), options.device);
  Shape strides = contiguous_strides(shape);
  Tensor t = Tensor::make(std::move(storage), std::move(shape), std::move(strides), 0,
                          options.dtype);
  if (options.requires_grad) detail::mark_requires_grad(t, "empty");
  return t;
}

namespace {
// full, zeros and ones; `op` names the one called.
Tensor filled(Shape shape, const Scalar& value, TensorOptions options, const char* op) {
  Tensor t = empty(std::move(shape), detail::without_grad(options));
  backend_for(t, op).fill(t, value);
  if (options.requires_grad) detail::mark_requires_grad(t, op);
  return t;
}
}  // namespace

Tensor full(Shape shape, const Scalar& value, TensorOptions options) {
  return filled(std::move(shape), value, options, "full");
}
Tensor zeros(Shape shape, TensorOptions options) {
  return filled(std::move(shape), 0, options, "zeros");
}
Tensor ones(Shape shape, TensorOptions options) {
  return filled(std::move(shape), 1, options, "ones");
}

Tensor eye(int64_t n, TensorOptions options) { return eye(n, n, options); }

Tensor eye(int64_t n, int64_t m, TensorOptions options) {
  GW_CHECK(n >= 0 && m >= 0, ShapeError, "[eye] sizes must be non-negative, got ", n, "x", m);
  Tensor t = zeros({n, m}, detail::without_grad(options));
  int64_t k = std::min(n, m);
  // The diagonal is a strided view: stride m + 1 through the flat storage.
  Tensor diag = Tensor::make(t.storage(), {k}, {m + 1}, 0, t.dtype());
  backend_for(t, "eye").fill(diag, 1);
  if (options.requires_grad) detail::mark_requires_grad(t, "eye");
  return t;
}

Tensor arange(const Scalar& end) { return arange(0, end, 1); }
Tensor arange(const Scalar& end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step) {
  bool any_float = start.is_floating() || end.is_floating() || step.is_floating();
  return arange(start, end, step, TensorOptions(any_float ? kFloat32 : kInt64));
}

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step,
              TensorOptions options) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  GW_CHECK(st != 0, InvalidArgumentError, "[arange] step must be nonzero");
  GW_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), InvalidArgumentError, "[arange] step ",
           st, " does not lead from ", s, " to ", e);
  const double count = std::ceil((e - s) / st);  // NaN or huge for infinite bounds
  GW_CHECK(count < 0x1p62, InvalidArgumentError, "[arange] from ", s, " to ", e, " by ", st,
           " is not a finite number of elements");
  auto n = static_cast<int64_t>(count);
  if (n > 0 && !is_floating(options.dtype)) {  // the ends as that dtype: refused if past it
    const Tensor ends = empty({2}, options.dtype);
    backend_for(DeviceType::CPU, "arange").fill(ends.narrow(0, 0, 1), Scalar(s));
    backend_for(DeviceType::CPU, "arange").fill(ends.narrow(0, 1, 1), Scalar(s + (n - 1) * st));
  }
  Tensor t = empty({n}, detail::without_grad(options));
  backend_for(t, "arange").iota(t, s, st);
  if (options.requires_grad) detail::mark_requires_grad(t, "arange");
  return t;
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  GW_CHECK(steps >= 0, InvalidArgumentError, "[linspace] steps must be non-negative, got ",
           steps);
  // Like PyTorch: the first half counts up from start, the second half down from end, so
  // both endpoints are exact.
  std::vector<double> v(steps);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    v[i] = (i < half || steps == 1) ? start + step * i : end - step * (steps - 1 - i);
  }
  Tensor t = from_vector(v, {steps}).to(options.dtype).to(options.device);
  if (options.requires_grad) detail::mark_requires_grad(t, "linspace");
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, const Scalar& value) {
  return full(t.sizes(), value, t.options());
}
Tensor empty_like(const Tensor& t, TensorOptions options) { return empty(t.sizes(), options); }
Tensor zeros_like(const Tensor& t, TensorOptions options) { return zeros(t.sizes(), options); }
Tensor ones_like(const Tensor& t, TensorOptions options) { return ones(t.sizes(), options); }

}  // namespace gw
