// Unary, binary, ternary (where) and clamp kernels. Each op is a small functor applied by
// `map_rows`, which picks a contiguous loop (vectorized by the compiler), a broadcast-scalar
// loop, or a generic strided loop from the inner strides of the current row.
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/float_math.h"
#include "core/cpu/half_as_float.h"
#include "core/cpu/loops.h"

namespace gw::cpu {

namespace {

#if defined(__SSE2__)
// Contiguous output rows at least this large (a whole output, single-threaded) are written with
// streaming (non-temporal) stores: they would not stay in the cache anyway, and a plain store
// first reads each line it writes (the "read for ownership"), a fourth stream of traffic beside
// an add's three. glibc's memcpy does the same for large copies. Not when the output overlaps
// an input: in place, the line was just read (nothing to save), and a partial overlap must
// see the stores in order.
constexpr int64_t kStreamBytes = int64_t{8} << 20;
// How far ahead of the line being computed its inputs are prefetched: one core's hardware
// prefetchers alone keep too few reads in flight to feed two input streams (measured here:
// 0.72-0.75x memcpy's bandwidth without, 0.87-0.96x with 2 KiB; 0.5 and 4 KiB did worse).
constexpr int64_t kPrefetchBytes = 2048;

template <typename Out, typename In>
bool streamable(const Out* o, const In* x, const In* y, int64_t n) {
  auto apart = [&](const In* in) {
    const auto* ob = reinterpret_cast<const char*>(o);
    const auto* ib = reinterpret_cast<const char*>(in);
    return ob + n * static_cast<int64_t>(sizeof(Out)) <= ib ||
           ib + n * static_cast<int64_t>(sizeof(In)) <= ob;
  };
  return n * static_cast<int64_t>(sizeof(Out)) >= kStreamBytes && 64 % sizeof(Out) == 0 &&
         apart(x) && apart(y);
}

// Writes the 64 bytes at `line` to `dst` (64-byte aligned) around the cache.
inline void stream_line(void* dst, const void* line) {
#if defined(__AVX512F__)
  _mm512_stream_si512(static_cast<__m512i*>(dst), _mm512_loadu_si512(line));
#elif defined(__AVX__)
  auto* d = static_cast<__m256i*>(dst);
  const auto* l = static_cast<const __m256i*>(line);
  _mm256_stream_si256(d, _mm256_loadu_si256(l));
  _mm256_stream_si256(d + 1, _mm256_loadu_si256(l + 1));
#else
  auto* d = static_cast<__m128i*>(dst);
  const auto* l = static_cast<const __m128i*>(line);
  for (int k = 0; k < 4; ++k) _mm_stream_si128(d + k, _mm_loadu_si128(l + k));
#endif
}

// o[i] = f(i) for i in [0, n), a large contiguous output: plain stores up to the first 64-byte
// boundary and after the last, streaming stores of whole lines between; prefetch(i) before
// each line.
template <typename Out, typename F, typename P>
void write_streaming(Out* o, int64_t n, F f, P prefetch) {
  constexpr int64_t kPerLine = 64 / static_cast<int64_t>(sizeof(Out));
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(o + i) % 64 != 0; ++i) o[i] = f(i);
  alignas(64) Out line[kPerLine];
  for (; i + kPerLine <= n; i += kPerLine) {
    prefetch(i);
    for (int64_t k = 0; k < kPerLine; ++k) line[k] = f(i + k);  // vectorized
    stream_line(o + i, line);
  }
  for (; i < n; ++i) o[i] = f(i);
  _mm_sfence();  // the streamed lines are visible before the kernel returns
}
#endif

// A kernel's sixteen-lane form of f, where it has one (float32 on AVX-512: see `lanes` below),
// runs its contiguous rows; NoLanes leaves them to the compiler's vectorization of f.
struct NoLanes {};
#if defined(__AVX512F__)
// o[i] = fv(x[i]...) for i in [0, n), sixteen at a time; the last partial group masked, so
// every element goes through fv.
template <typename FV, typename... In>
void run_lanes(float* o, int64_t n, FV fv, const In*... x) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, fv(_mm512_loadu_ps(x + i)...));
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(o + i, m, fv(_mm512_maskz_loadu_ps(m, x + i)...));
  }
}
#endif

template <typename Out, typename In, typename F, typename FV = NoLanes>
void map_unary(const Tensor& in, const Tensor& out, F f, FV fv = {}) {
  for_each_row<2>(out.sizes(), {&out, &in}, [&](auto& p, auto& s, int64_t n) {
    auto* o = reinterpret_cast<Out*>(p[0]);
    auto* x = reinterpret_cast<const In*>(p[1]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
#if defined(__AVX512F__)
      if constexpr (!std::is_same_v<FV, NoLanes>) return run_lanes(o, n, fv, x);
#endif
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const In*>(p[1] + i * s[1]));
      }
    }
  });
}

template <typename Out, typename In, typename F, typename FV = NoLanes>
void map_binary(const Tensor& a, const Tensor& b, const Tensor& out, F f, FV fv = {}) {
  for_each_row<3>(out.sizes(), {&out, &a, &b}, [&](auto& p, auto& s, int64_t n) {
    auto* o = reinterpret_cast<Out*>(p[0]);
    auto* x = reinterpret_cast<const In*>(p[1]);
    auto* y = reinterpret_cast<const In*>(p[2]);
    constexpr int64_t so = sizeof(Out), si = sizeof(In);
    if (s[0] == so && s[1] == si && s[2] == si) {
#if defined(__AVX512F__)
      if constexpr (!std::is_same_v<FV, NoLanes>) return run_lanes(o, n, fv, x, y);
#endif
#if defined(__SSE2__)
      if (streamable(o, x, y, n)) {
        write_streaming(
            o, n, [&](int64_t i) { return f(x[i], y[i]); },
            [&](int64_t i) {
              _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(y + i) + kPrefetchBytes, _MM_HINT_T0);
            });
        return;
      }
#endif
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == so && s[1] == si && s[2] == 0) {
      const In yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (s[0] == so && s[1] == 0 && s[2] == si) {
      const In xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            f(*reinterpret_cast<const In*>(p[1] + i * s[1]),
              *reinterpret_cast<const In*>(p[2] + i * s[2]));
      }
    }
  });
}

template <typename T>
T gelu_exact(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float z = x * kSqrtHalf;
    return 0.5f * x * (1.0f + erf_given_exp(z, exp_minus_square(z)));
  } else {
    return T(0.5) * x * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
  }
}
template <typename T>
T gelu_tanh(T x) {
  constexpr T k = T(0.7978845608028654);  // sqrt(2/pi)
  return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
}
template <typename T>
T sigmoid(T x) {
  // Split by sign so exp never overflows.
  if (x >= 0) return T(1) / (T(1) + std::exp(-x));
  T e = std::exp(x);
  return e / (T(1) + e);
}

// Each unary op's value at one element, for the dtypes its rule admits (core/op_list.h: the
// front end promotes integers for float-only ops and refuses bools where the rule does). One
// case per op and no default: a missing op fails the build.
template <typename T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out) {
  using U = UnaryOp;
  constexpr bool kBool = std::is_same_v<T, bool>;
  constexpr bool kFloat = std::is_floating_point_v<T>;
  auto map = [&](auto f) { map_unary<T, T>(in, out, f); };
  switch (op) {
    case U::Neg:
      if constexpr (!kBool) return map([](T x) { return T(-x); });
      break;
    case U::Abs:  // of bools: the identity
      if constexpr (kBool)
        return map([](T x) { return x; });
      else
        return map([](T x) { return x < 0 ? T(-x) : x; });
    case U::Relu:
      if constexpr (kBool)
        return map([](T x) { return x; });
      else
        return map([](T x) { return x > T(0) ? x : T(0); });
    case U::Square:
      if constexpr (!kBool) return map([](T x) { return T(x * x); });
      break;
    case U::Sign:
      if constexpr (!kBool) return map([](T x) { return T((T(0) < x) - (x < T(0))); });
      break;
    case U::LogicalNot:
      return map_unary<bool, T>(in, out, [](T x) { return !x; });
    case U::Floor:  // of integers: the identity
      if constexpr (kFloat)
        return map([](T x) { return std::floor(x); });
      else if constexpr (!kBool)
        return map([](T x) { return x; });
      break;
    case U::Ceil:
      if constexpr (kFloat)
        return map([](T x) { return std::ceil(x); });
      else if constexpr (!kBool)
        return map([](T x) { return x; });
      break;
    case U::Round:
      if constexpr (kFloat)
        return map([](T x) { return std::nearbyint(x); });
      else if constexpr (!kBool)
        return map([](T x) { return x; });
      break;
#define GW_FLOAT_OP(Op, ...)                                    \
  case U::Op:                                                   \
    if constexpr (kFloat) return map([](T x) { __VA_ARGS__; }); \
    break;
      GW_FLOAT_OP(Exp, return std::exp(x))
      GW_FLOAT_OP(Log, return std::log(x))
      GW_FLOAT_OP(Log1p, return std::log1p(x))
      GW_FLOAT_OP(Expm1, return std::expm1(x))
      GW_FLOAT_OP(Sqrt, return std::sqrt(x))
      GW_FLOAT_OP(Rsqrt, return T(1) / std::sqrt(x))
      GW_FLOAT_OP(Reciprocal, return T(1) / x)
      GW_FLOAT_OP(Sigmoid, return sigmoid(x))
      GW_FLOAT_OP(Tanh, return std::tanh(x))
    case U::Gelu:
#if defined(GW_FLOAT_LANES)
      if constexpr (std::is_same_v<T, float>)
        return map_unary<T, T>(
            in, out, [](T x) { return gelu_exact(x); }, [](__m512 x) { return lanes::gelu(x); });
#endif
      if constexpr (kFloat) return map([](T x) { return gelu_exact(x); });
      break;
      GW_FLOAT_OP(GeluTanh, return gelu_tanh(x))
      GW_FLOAT_OP(Sin, return std::sin(x))
      GW_FLOAT_OP(Cos, return std::cos(x))
      GW_FLOAT_OP(Erf, return std::erf(x))
      GW_FLOAT_OP(Silu, return x * sigmoid(x))
#undef GW_FLOAT_OP
  }
  throw DTypeError(detail::str("[", op_name(op), "] is not supported for dtype ", in.dtype()));
}

// d op(x)/dx of the activations whose derivative runs fused (has_fused_unary_backward), at one
// element; unary_derivative (core/ops/elementwise.cpp) has the same formulas as ops.
template <typename T>
T gelu_exact_derivative(T x) {  // Φ(x) + x·φ(x)
  if constexpr (std::is_same_v<T, float>) {
    const float z = x * kSqrtHalf;
    const float e = exp_minus_square(z);  // exp(-x²/2), once for erf and for φ
    const float cdf = 0.5f * (1.0f + erf_given_exp(z, e));
    return madd(x * e, kInvSqrt2Pi, cdf);  // fused, as in the lanes
  } else {
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
    return cdf + x * std::exp(T(-0.5) * x * x) * T(0.3989422804014327);
  }
}
template <typename T>
T gelu_tanh_derivative(T x) {
  constexpr T k = T(0.7978845608028654), c = T(0.044715);
  const T t = std::tanh(k * (x + c * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x);
}
template <typename T>
T silu_derivative(T x) {  // σ(x)·(1 + x·(1 - σ(x)))
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

template <typename T>
T int_pow(T base, T exp) {
  GW_CHECK(exp >= 0, InvalidArgumentError,
           "[pow] integers to negative integer powers are not allowed (exponent ", exp, ")");
  T result = 1;
  while (exp) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}

// Each binary op at one element, for the dtypes its rule admits (comparisons and logical ops
// write bools). One case per op and no default, as unary_typed: a missing op fails the build.
template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using B = BinaryOp;
  constexpr bool kBool = std::is_same_v<T, bool>;
  constexpr bool kFloat = std::is_floating_point_v<T>;
  auto test = [&](auto f) { map_binary<bool, T>(a, b, out, f); };
  auto map = [&](auto f) { map_binary<T, T>(a, b, out, f); };
  // Maximum and minimum propagate NaN, as PyTorch's do.
  auto pick = [](bool first, T x, T y) {
    if constexpr (kFloat) {
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<T>::quiet_NaN();
    }
    return first ? x : y;
  };
  switch (op) {
    case B::Eq:
      return test([](T x, T y) { return x == y; });
    case B::Ne:
      return test([](T x, T y) { return x != y; });
    case B::Lt:
      return test([](T x, T y) { return x < y; });
    case B::Le:
      return test([](T x, T y) { return x <= y; });
    case B::Gt:
      return test([](T x, T y) { return x > y; });
    case B::Ge:
      return test([](T x, T y) { return x >= y; });
    case B::LogicalAnd:
      return test([](T x, T y) { return bool(x) && bool(y); });
    case B::LogicalOr:
      return test([](T x, T y) { return bool(x) || bool(y); });
    // PyTorch: + and max of bools are or, * and min are and.
    case B::Add:
      if constexpr (kBool)
        return map([](T x, T y) { return x || y; });
      else
        return map([](T x, T y) { return T(x + y); });
    case B::Mul:
      if constexpr (kBool)
        return map([](T x, T y) { return x && y; });
      else
        return map([](T x, T y) { return T(x * y); });
    case B::Maximum:
      if constexpr (kBool)
        return map([](T x, T y) { return x || y; });
      else
        return map([&](T x, T y) { return pick(x > y, x, y); });
    case B::Minimum:
      if constexpr (kBool)
        return map([](T x, T y) { return x && y; });
      else
        return map([&](T x, T y) { return pick(x < y, x, y); });
    case B::Sub:
      if constexpr (!kBool) return map([](T x, T y) { return T(x - y); });
      break;
    case B::Div:  // integer division goes through floating point (the front end converts)
      if constexpr (kFloat) return map([](T x, T y) { return x / y; });
      break;
    case B::Pow:
      if constexpr (kFloat)
        return map([](T x, T y) { return std::pow(x, y); });
      else if constexpr (!kBool)
        return map(int_pow<T>);
      break;
  }
  if constexpr (kBool)
    throw DTypeError(detail::str("[", op_name(op), "] is not supported for bool tensors"));
  throw InternalError(detail::str("[", op_name(op), "] no CPU kernel for dtype ", a.dtype()));
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  if (in_float32({&in}, {&out}, [&](const auto& t) { unary(op, t[0], t[1]); })) return;
  dispatch<AllTypes>(in.dtype(), op_name(op), [&]<typename T>() { unary_typed<T>(op, in, out); });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& out) {
  if (in_float32({&g, &x}, {&out}, [&](const auto& t) { unary_backward(op, t[0], t[1], t[2]); }))
    return;
  dispatch<FloatTypes>(x.dtype(), op_name(op), [&]<typename T>() {
    auto map = [&](auto derivative) {
      map_binary<T, T>(g, x, out, [&](T gi, T xi) { return gi * derivative(xi); });
    };
    switch (op) {
      case UnaryOp::Relu:  // the gradient where the output is positive (as where(y > 0, g, 0))
        return map_binary<T, T>(g, x, out, [](T gi, T xi) { return xi > T(0) ? gi : T(0); });
      case UnaryOp::Gelu:  // lambdas, not function pointers: inlined (GELU's loop vectorizes)
#if defined(GW_FLOAT_LANES)
        if constexpr (std::is_same_v<T, float>)
          return map_binary<T, T>(
              g, x, out, [](T gi, T xi) { return gi * gelu_exact_derivative(xi); },
              [](__m512 gi, __m512 xi) { return _mm512_mul_ps(gi, lanes::gelu_derivative(xi)); });
#endif
        return map([](T xi) { return gelu_exact_derivative(xi); });
      case UnaryOp::GeluTanh:
        return map([](T xi) { return gelu_tanh_derivative(xi); });
      case UnaryOp::Silu:
        return map([](T xi) { return silu_derivative(xi); });
      default:
        Backend::unary_backward(op, g, x, out);  // not fused here: throws
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (in_float32({&a, &b}, {&out}, [&](const auto& t) { binary(op, t[0], t[1], t[2]); })) return;
  dispatch<AllTypes>(a.dtype(), op_name(op),
                     [&]<typename T>() { binary_typed<T>(op, a, b, out); });
}

void CpuBackend::add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha,
                            const Tensor& out) {
  if (in_float32({&a, &b}, {&out}, [&](const auto& t) { add_scaled(t[0], t[1], alpha, t[2]); }))
    return;
  dispatch<NumericTypes>(out.dtype(), "add", [&]<typename T>() {
    const T k = alpha.to<T>();
    map_binary<T, T>(a, b, out, [k](T x, T y) { return T(x + k * y); });
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch<CopyTypes>(out.dtype(), "where", [&]<typename T>() {  // moves only: 16-bit types too
    for_each_row<4>(out.sizes(), {&out, &cond, &a, &b}, [](auto& p, auto& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            *reinterpret_cast<const T*>(c ? p[2] + i * s[2] : p[3] + i * s[3]);
      }
    });
  });
}

void CpuBackend::clamp(const Tensor& in, std::optional<Scalar> lo, std::optional<Scalar> hi,
                       const Tensor& out) {
  if (in_float32({&in}, {&out}, [&](const auto& t) { clamp(t[0], lo, hi, t[1]); })) return;
  dispatch<NumericTypes>(in.dtype(), "clamp", [&]<typename T>() {
    // A missing bound is no bound at all: infinities stay infinite, as in PyTorch.
    const T l = lo ? lo->to<T>() : lowest_value<T>();
    const T h = hi ? hi->to<T>() : highest_value<T>();
    map_unary<T, T>(in, out, [l, h](T x) {
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(x)) return x;
      }
      return std::min(std::max(x, l), h);  // min > max gives max everywhere, as in PyTorch
    });
  });
}

}  // namespace gw::cpu
