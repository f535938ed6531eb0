// Unary, binary, add_scaled, where and clamp: functors for the one strided kernel
// (loops.cuh). The op is a runtime switch inside the functor, uniform across a launch, so
// each dtype compiles one kernel per family instead of one per op. Host code checks what the
// CPU backend rejects (same errors, same messages) before launching.
#include "cuda/cuda_backend.h"
#include "cuda/loops.cuh"

namespace gw::cuda {

namespace {

template <typename C>
__device__ C sigmoid(C x) {
  // Split by sign so exp never overflows (as on the CPU).
  if (x >= C(0)) return C(1) / (C(1) + exp(-x));
  C e = exp(x);
  return e / (C(1) + e);
}

template <typename C>
__device__ C apply_float(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return x < C(0) ? -x : x;
    case UnaryOp::Square: return x * x;
    case UnaryOp::Sign: return C((C(0) < x) - (x < C(0)));
    case UnaryOp::Relu: return x > C(0) ? x : C(0);
    case UnaryOp::Exp: return exp(x);
    case UnaryOp::Log: return log(x);
    case UnaryOp::Log1p: return log1p(x);
    case UnaryOp::Expm1: return expm1(x);
    case UnaryOp::Sqrt: return sqrt(x);
    case UnaryOp::Rsqrt: return C(1) / sqrt(x);
    case UnaryOp::Reciprocal: return C(1) / x;
    case UnaryOp::Sigmoid: return sigmoid(x);
    case UnaryOp::Tanh: return tanh(x);
    case UnaryOp::Gelu: return C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440)));
    case UnaryOp::GeluTanh: {
      const C k = C(0.7978845608028654);  // sqrt(2/pi)
      return C(0.5) * x * (C(1) + tanh(k * (x + C(0.044715) * x * x * x)));
    }
    case UnaryOp::Sin: return sin(x);
    case UnaryOp::Cos: return cos(x);
    case UnaryOp::Erf: return erf(x);
    case UnaryOp::Floor: return floor(x);
    case UnaryOp::Ceil: return ceil(x);
    case UnaryOp::Round: return rint(x);  // half to even, like std::nearbyint
    default: return x;                     // LogicalNot has its own functor
  }
}

template <typename C>
__device__ C apply_integral(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::Neg: return C(-x);
    case UnaryOp::Abs: return x < C(0) ? C(-x) : x;
    case UnaryOp::Square: return C(x * x);
    case UnaryOp::Sign: return C((C(0) < x) - (x < C(0)));
    case UnaryOp::Relu: return x > C(0) ? x : C(0);
    default: return x;  // floor, ceil and round of integers
  }
}

template <typename T>
struct UnaryFn {
  UnaryOp op;
  __device__ void operator()(char** p) const {
    using C = compute_t<T>;
    const C x = load<T>(p[1]);
    if constexpr (std::is_same_v<C, bool>) {
      store<T>(p[0], x);  // abs and relu of bools (the host rejects the rest)
    } else if constexpr (std::is_floating_point_v<C>) {
      store<T>(p[0], apply_float(op, x));
    } else {
      store<T>(p[0], apply_integral(op, x));
    }
  }
};

template <typename T>
struct LogicalNotFn {
  __device__ void operator()(char** p) const {
    *reinterpret_cast<bool*>(p[0]) = !static_cast<bool>(load<T>(p[1]));
  }
};

template <typename C>
__device__ C int_pow(C base, C exp, ErrorSlot err) {
  if (exp < 0) {
    err.report(static_cast<long long>(exp));
    return C(0);
  }
  C result = 1;
  while (exp) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}

template <typename T>
struct BinaryFn {
  BinaryOp op;
  ErrorSlot err;  // integer pow reports negative exponents here
  __device__ void operator()(char** p) const {
    using C = compute_t<T>;
    const C x = load<T>(p[1]), y = load<T>(p[2]);
    bool* flag = reinterpret_cast<bool*>(p[0]);
    switch (op) {
      case BinaryOp::Eq: *flag = x == y; return;
      case BinaryOp::Ne: *flag = x != y; return;
      case BinaryOp::Lt: *flag = x < y; return;
      case BinaryOp::Le: *flag = x <= y; return;
      case BinaryOp::Gt: *flag = x > y; return;
      case BinaryOp::Ge: *flag = x >= y; return;
      case BinaryOp::LogicalAnd: *flag = static_cast<bool>(x) && static_cast<bool>(y); return;
      case BinaryOp::LogicalOr: *flag = static_cast<bool>(x) || static_cast<bool>(y); return;
      default: break;
    }
    if constexpr (std::is_same_v<C, bool>) {  // + and * on bools are or/and (PyTorch)
      const bool r = (op == BinaryOp::Add || op == BinaryOp::Maximum) ? (x || y) : (x && y);
      store<T>(p[0], r);
    } else {
      C r = C(0);
      switch (op) {
        case BinaryOp::Add: r = C(x + y); break;
        case BinaryOp::Sub: r = C(x - y); break;
        case BinaryOp::Mul: r = C(x * y); break;
        case BinaryOp::Div: r = C(x / y); break;  // floating only (checked on the host)
        case BinaryOp::Pow:
          if constexpr (std::is_floating_point_v<C>) {
            r = pow(x, y);
          } else {
            r = int_pow(x, y, err);
          }
          break;
        case BinaryOp::Maximum:
        case BinaryOp::Minimum:
          if constexpr (std::is_floating_point_v<C>) {
            if (is_nan(x) || is_nan(y)) {
              r = x + y;  // NaN propagates
              break;
            }
          }
          if (op == BinaryOp::Maximum) {
            r = x > y ? x : y;
          } else {
            r = x < y ? x : y;
          }
          break;
        default: break;
      }
      store<T>(p[0], r);
    }
  }
};

template <typename T>
struct AddScaledFn {
  compute_t<T> alpha;
  __device__ void operator()(char** p) const {
    using C = compute_t<T>;
    store<T>(p[0], C(load<T>(p[1]) + alpha * load<T>(p[2])));
  }
};

template <typename U>
struct WhereFn {
  __device__ void operator()(char** p) const {
    const bool c = *reinterpret_cast<const bool*>(p[1]);
    *reinterpret_cast<U*>(p[0]) = *reinterpret_cast<const U*>(c ? p[2] : p[3]);
  }
};

template <typename T>
struct ClampFn {
  compute_t<T> lo, hi;
  __device__ void operator()(char** p) const {
    using C = compute_t<T>;
    C x = load<T>(p[1]);
    if constexpr (std::is_floating_point_v<C>) {
      if (is_nan(x)) {
        store<T>(p[0], x);
        return;
      }
    }
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;  // min > max gives max everywhere, as in PyTorch
    store<T>(p[0], x);
  }
};

}  // namespace

void CudaBackend::unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<2>(out.sizes(), {&out, &in}, op_name(op));
  dispatch<CudaAllTypes>(in.dtype(), op_name(op), [&]<typename T>() {
    using D = cuda_type_t<T>;
    // core/ops checked the dtype: float-only ops get floating point, bool only abs and relu.
    if (op == UnaryOp::LogicalNot) return launch_strided(it, LogicalNotFn<D>{}, on.stream);
    launch_strided(it, UnaryFn<D>{op}, on.stream);
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<3>(out.sizes(), {&out, &a, &b}, op_name(op));
  dispatch<CudaAllTypes>(a.dtype(), op_name(op), [&]<typename T>() {
    using D = cuda_type_t<T>;
    constexpr DType dt = dtype_of_v<T>;
    if constexpr (dt == kBool) {
      GW_CHECK(is_comparison(op) || op == BinaryOp::Add || op == BinaryOp::Maximum ||
                   op == BinaryOp::Mul || op == BinaryOp::Minimum,
               DTypeError, "[", op_name(op), "] is not supported for bool tensors");
    } else if constexpr (!is_floating(dt)) {
      GW_CHECK(op != BinaryOp::Div, InternalError, "[", op_name(op),
               "] no CUDA kernel for dtype ", a.dtype());
    }
    if (!is_floating(dt) && dt != kBool && op == BinaryOp::Pow) {
      ErrorFlag flag(out.device(), on.stream);
      launch_strided(it, BinaryFn<D>{op, flag.slot()}, on.stream);
      if (auto e = flag.check()) {
        throw InvalidArgumentError(detail::str(
            "[pow] integers to negative integer powers are not allowed (exponent ", *e, ")"));
      }
      return;
    }
    launch_strided(it, BinaryFn<D>{op, ErrorSlot{nullptr, nullptr}}, on.stream);
  });
}

void CudaBackend::add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha,
                             const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<3>(out.sizes(), {&out, &a, &b}, "add");
  dispatch<CudaNumericTypes>(out.dtype(), "add", [&]<typename T>() {
    using C = compute_t<cuda_type_t<T>>;
    launch_strided(it, AddScaledFn<cuda_type_t<T>>{alpha.to<C>()}, on.stream);
  });
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<4>(out.sizes(), {&out, &cond, &a, &b}, "where");
  dispatch_by_size(out.element_size(), "where",
                   [&]<typename U>() { launch_strided(it, WhereFn<U>{}, on.stream); });
}

void CudaBackend::clamp(const Tensor& in, std::optional<Scalar> lo, std::optional<Scalar> hi,
                        const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<2>(out.sizes(), {&out, &in}, "clamp");
  dispatch<CudaNumericTypes>(in.dtype(), "clamp", [&]<typename T>() {
    using C = compute_t<cuda_type_t<T>>;
    const C l = lo ? lo->to<C>() : lowest_value<C>();
    const C h = hi ? hi->to<C>() : highest_value<C>();
    launch_strided(it, ClampFn<cuda_type_t<T>>{l, h}, on.stream);
  });
}

}  // namespace gw::cuda
