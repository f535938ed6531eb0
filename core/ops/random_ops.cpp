#include "core/ops/random_ops.h"

#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"

namespace gw {

namespace {
Tensor random_tensor(RandomKind kind, Shape shape, double a, double b, Generator& gen,
                     TensorOptions options, const char* op) {
  Tensor t = empty(std::move(shape), detail::without_grad(options));
  backend_for(t, op).random(kind, t, a, b, gen);
  if (options.requires_grad) detail::mark_requires_grad(t, op);
  return t;
}
}  // namespace

Tensor rand(Shape shape, Generator& gen, TensorOptions options) {
  return random_tensor(RandomKind::Uniform, std::move(shape), 0, 1, gen, options, "rand");
}
Tensor randn(Shape shape, Generator& gen, TensorOptions options) {
  return random_tensor(RandomKind::Normal, std::move(shape), 0, 1, gen, options, "randn");
}
Tensor randint(int64_t low, int64_t high, Shape shape, Generator& gen, TensorOptions options) {
  GW_CHECK(low < high, InvalidArgumentError, "[randint] expects low < high, got ", low, " and ",
           high);
  // A 16-bit float holds every integer up to 2^8 (bfloat16) or 2^11 (float16), no further.
  const DType dtype = options.dtype;
  if (is_16_bit_float(dtype)) {
    const int64_t exact = dtype == kBFloat16 ? 256 : 2048;
    GW_CHECK(low >= -exact && high - 1 <= exact, InvalidArgumentError, "[randint] [", low, ", ",
             high, ") holds integers that ", dtype, " cannot: it is exact in [", -exact, ", ",
             exact, "]");
  }
  return random_tensor(RandomKind::RandInt, std::move(shape), static_cast<double>(low),
                       static_cast<double>(high), gen, options, "randint");
}
Tensor rand(Shape shape, TensorOptions options) {
  return rand(std::move(shape), default_generator(), options);
}
Tensor randn(Shape shape, TensorOptions options) {
  return randn(std::move(shape), default_generator(), options);
}
Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions options) {
  return randint(low, high, std::move(shape), default_generator(), options);
}

Tensor randperm(int64_t n, Generator& gen) {
  GW_CHECK(n >= 0, InvalidArgumentError, "[randperm] n must be non-negative, got ", n);
  Tensor t = arange(n);
  int64_t* p = t.data_ptr<int64_t>();
  std::lock_guard lock(gen.mutex());
  for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(p[i], p[gen.next_below(static_cast<uint64_t>(i + 1))]);
  }
  return t;
}

Tensor& uniform_(Tensor& t, double from, double to, Generator& gen) {
  GW_CHECK(from <= to, InvalidArgumentError, "[uniform_] expects from <= to, got ", from, " and ",
           to);
  detail::check_inplace_allowed(t, "uniform_");
  check_writable("uniform_", t);
  backend_for(t, "uniform_").random(RandomKind::Uniform, t, from, to, gen);
  t.bump_version();
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator& gen) {
  GW_CHECK(std >= 0, InvalidArgumentError, "[normal_] std must be non-negative, got ", std);
  detail::check_inplace_allowed(t, "normal_");
  check_writable("normal_", t);
  backend_for(t, "normal_").random(RandomKind::Normal, t, mean, std, gen);
  t.bump_version();
  return t;
}

Tensor bernoulli(const Tensor& p, Generator& gen) {
  Tensor out = empty(p.sizes(), p.options());
  backend_for(p, "bernoulli").bernoulli(p, out, gen);
  return out;
}
Tensor bernoulli(const Tensor& p) { return bernoulli(p, default_generator()); }

Tensor& bernoulli_(Tensor& t, double p, Generator& gen) {
  GW_CHECK(p >= 0 && p <= 1, InvalidArgumentError, "[bernoulli_] p must be in [0, 1], got ", p);
  detail::check_inplace_allowed(t, "bernoulli_");
  check_writable("bernoulli_", t);
  backend_for(t, "bernoulli_").random(RandomKind::Bernoulli, t, p, 0, gen);
  t.bump_version();
  return t;
}

Tensor& Tensor::uniform_(double from, double to) {
  return gw::uniform_(*this, from, to, default_generator());
}
Tensor& Tensor::normal_(double mean, double std) {
  return gw::normal_(*this, mean, std, default_generator());
}

}  // namespace gw
