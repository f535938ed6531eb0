// Unary, binary, add_scaled, where and clamp: functors for the one strided kernel
// (loops.cuh). The op is a runtime switch inside the functor, uniform across a launch, so
// each dtype compiles one kernel per family instead of one per op. Host code checks what the
// CPU backend rejects (same errors, same messages) before launching.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

template <typename C>
__host__ __device__ C sigmoid(C x) {
  // Split by sign so exp never overflows (as on the CPU).
  if (x >= C(0)) return C(1) / (C(1) + exp(-x));
  C e = exp(x);
  return e / (C(1) + e);
}

// Each unary op's value at one element in the compute type C (not bool: abs and relu of bools
// are the identity, UnaryFn; logical_not has its own functor). Integers reach only the ops
// their rule admits (core/op_list.h: core/ops promotes them for float-only ops). One case per
// op and no default: compiled for the host too (the instantiation below), where a missing op
// fails the build.
template <typename C>
__host__ __device__ C unary_value(UnaryOp op, C x) {
  constexpr bool kFloat = std::is_floating_point_v<C>;
#define GW_FLOAT_OP(Op, ...) \
  case UnaryOp::Op:          \
    if constexpr (kFloat)    \
      return __VA_ARGS__;    \
    else                     \
      return x;
  switch (op) {
    case UnaryOp::Neg:
      return C(-x);
    case UnaryOp::Abs:
      return x < C(0) ? C(-x) : x;
    case UnaryOp::Square:
      return C(x * x);
    case UnaryOp::Sign:
      return C((C(0) < x) - (x < C(0)));
    case UnaryOp::Relu:
      return x > C(0) ? x : C(0);
    case UnaryOp::LogicalNot:
      return x;  // LogicalNotFn
      // Rounding an integer is the identity.
      GW_FLOAT_OP(Floor, floor(x))
      GW_FLOAT_OP(Ceil, ceil(x))
      GW_FLOAT_OP(Round, rint(x))  // half to even, like std::nearbyint
      GW_FLOAT_OP(Exp, exp(x))
      GW_FLOAT_OP(Log, log(x))
      GW_FLOAT_OP(Log1p, log1p(x))
      GW_FLOAT_OP(Expm1, expm1(x))
      GW_FLOAT_OP(Sqrt, sqrt(x))
      GW_FLOAT_OP(Rsqrt, C(1) / sqrt(x))
      GW_FLOAT_OP(Reciprocal, C(1) / x)
      GW_FLOAT_OP(Sigmoid, sigmoid(x))
      GW_FLOAT_OP(Tanh, tanh(x))
      GW_FLOAT_OP(Gelu, C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440))))
      GW_FLOAT_OP(GeluTanh, C(0.5) * x *
                                (C(1) + tanh(C(0.7978845608028654) *  // sqrt(2/pi)
                                             (x + C(0.044715) * x * x * x))))
      GW_FLOAT_OP(Sin, sin(x))
      GW_FLOAT_OP(Cos, cos(x))
      GW_FLOAT_OP(Erf, erf(x))
      GW_FLOAT_OP(Silu, x * sigmoid(x))
  }
#undef GW_FLOAT_OP
  return x;
}
template float unary_value<float>(UnaryOp, float);  // the host's check of the switch

template <typename T>
struct UnaryFn {
  UnaryOp op;
  __device__ void operator()(char** p) const {
    using C = compute_t<T>;
    const C x = load<T>(p[1]);
    if constexpr (std::is_same_v<C, bool>) {
      store<T>(p[0], x);  // abs and relu of bools (the host rejects the rest)
    } else {
      store<T>(p[0], unary_value(op, x));
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

// The binary ops binary_value and apply_binary know. They run on the device only, where no
// compiler checks a switch for missing cases: a binary op added to core/op_list.h fails the
// build here until it has its case below (and this count is raised).
#define GW_COUNT_OP(...) +1
static_assert(0 GW_BINARY_OPS(GW_COUNT_OP) == 15, "a new binary op needs its CUDA case here");
#undef GW_COUNT_OP

// x op y for the arithmetic ops, in the compute type C.
template <typename C>
__device__ __forceinline__ C binary_value(BinaryOp op, C x, C y, ErrorSlot err) {
  if constexpr (std::is_same_v<C, bool>) {  // + and * on bools are or/and (PyTorch)
    return (op == BinaryOp::Add || op == BinaryOp::Maximum) ? (x || y) : (x && y);
  } else {
    switch (op) {
      case BinaryOp::Add:
        return C(x + y);
      case BinaryOp::Sub:
        return C(x - y);
      case BinaryOp::Mul:
        return C(x * y);
      case BinaryOp::Div:
        return C(x / y);  // floating only (checked on the host)
      case BinaryOp::Pow:
        if constexpr (std::is_floating_point_v<C>) {
          return pow(x, y);
        } else {
          return int_pow(x, y, err);
        }
      case BinaryOp::Maximum:
      case BinaryOp::Minimum:
        if constexpr (std::is_floating_point_v<C>) {
          if (is_nan(x) || is_nan(y)) return x + y;  // NaN propagates
        }
        if (op == BinaryOp::Maximum) return x > y ? x : y;
        return x < y ? x : y;
      default:
        return C(0);
    }
  }
}

// out = x op y for one element: comparisons write a bool, the rest a T.
template <typename T>
__device__ __forceinline__ void apply_binary(BinaryOp op, compute_t<T> x, compute_t<T> y, char* out,
                                             ErrorSlot err) {
  bool* flag = reinterpret_cast<bool*>(out);
  switch (op) {
    case BinaryOp::Eq:
      *flag = x == y;
      return;
    case BinaryOp::Ne:
      *flag = x != y;
      return;
    case BinaryOp::Lt:
      *flag = x < y;
      return;
    case BinaryOp::Le:
      *flag = x <= y;
      return;
    case BinaryOp::Gt:
      *flag = x > y;
      return;
    case BinaryOp::Ge:
      *flag = x >= y;
      return;
    case BinaryOp::LogicalAnd:
      *flag = static_cast<bool>(x) && static_cast<bool>(y);
      return;
    case BinaryOp::LogicalOr:
      *flag = static_cast<bool>(x) || static_cast<bool>(y);
      return;
    default:
      store<T>(out, binary_value(op, x, y, err));
  }
}

template <typename T>
struct BinaryFn {
  BinaryOp op;
  ErrorSlot err;  // integer pow reports negative exponents here
  __device__ void operator()(char** p) const {
    apply_binary<T>(op, load<T>(p[1]), load<T>(p[2]), p[0], err);
  }
};

// One operand is a host scalar, passed by value: p[1] is the tensor operand.
template <typename T>
struct BinaryScalarFn {
  BinaryOp op;
  ErrorSlot err;
  compute_t<T> scalar;
  bool scalar_first;  // scalar op tensor rather than tensor op scalar
  __device__ void operator()(char** p) const {
    const compute_t<T> v = load<T>(p[1]);
    apply_binary<T>(op, scalar_first ? scalar : v, scalar_first ? v : scalar, p[0], err);
  }
};

// The same ops as values, for the contiguous fast path (try_launch_vector).
template <typename T>
struct UnaryValueFn {
  UnaryOp op;
  __device__ compute_t<T> operator()(compute_t<T> x) const { return unary_value(op, x); }
};

// A unary op fixed at compile time: the activations of a network are the hot unary ops, and
// with the op a constant the per-element switch folds away (GELU's erf already costs many
// instructions per element; a switch on top cost a tenth of the bandwidth).
template <typename T, UnaryOp kOp>
struct FixedUnaryFn {
  __device__ compute_t<T> operator()(compute_t<T> x) const { return unary_value(kOp, x); }
};

// Calls f.template operator()<kOp>() when op is one of the hot floating-point unary ops, and
// returns whether it did.
template <typename F>
bool with_fixed_unary(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::Gelu:
      f.template operator()<UnaryOp::Gelu>();
      return true;
    case UnaryOp::GeluTanh:
      f.template operator()<UnaryOp::GeluTanh>();
      return true;
    case UnaryOp::Relu:
      f.template operator()<UnaryOp::Relu>();
      return true;
    case UnaryOp::Sigmoid:
      f.template operator()<UnaryOp::Sigmoid>();
      return true;
    case UnaryOp::Tanh:
      f.template operator()<UnaryOp::Tanh>();
      return true;
    case UnaryOp::Exp:
      f.template operator()<UnaryOp::Exp>();
      return true;
    default:
      return false;
  }
}

template <typename T>
struct BinaryValueFn {
  BinaryOp op;
  ErrorSlot err;
  __device__ compute_t<T> operator()(compute_t<T> x, compute_t<T> y) const {
    return binary_value(op, x, y, err);
  }
};

template <typename T>
struct BinaryScalarValueFn {
  BinaryOp op;
  ErrorSlot err;
  compute_t<T> scalar;
  bool scalar_first;
  __device__ compute_t<T> operator()(compute_t<T> v) const {
    return binary_value(op, scalar_first ? scalar : v, scalar_first ? v : scalar, err);
  }
};

template <typename T>
struct AddScaledValueFn {
  compute_t<T> alpha;
  __device__ compute_t<T> operator()(compute_t<T> x, compute_t<T> y) const {
    return compute_t<T>(x + alpha * y);
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
    if constexpr (std::is_floating_point_v<compute_t<D>>) {
      bool done = false;
      const bool fixed = with_fixed_unary(op, [&]<UnaryOp kOp>() {
        done = try_launch_vector<D, 1>(out, {&in}, FixedUnaryFn<D, kOp>{}, on.stream);
      });
      if (fixed && done) return;
    }
    if constexpr (!std::is_same_v<D, bool>) {
      if (try_launch_vector<D, 1>(out, {&in}, UnaryValueFn<D>{op}, on.stream)) return;
    }
    launch_strided(it, UnaryFn<D>{op}, on.stream);
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  OnDevice on(out);
  // A CPU operand is a broadcast 0-dim tensor (core's wrapped numbers): its value rides in the
  // kernel's arguments, so the kernel streams one operand fewer. It has the other's dtype, or
  // float32 beside a 16-bit float (core keeps it unrounded: the kernel computes in float).
  const bool scalar_first = a.device().is_cpu();
  const Tensor* scalar = scalar_first ? &a : b.device().is_cpu() ? &b : nullptr;
  const Tensor& tensor = scalar_first ? b : a;
  auto it3 = scalar ? StridedIter<3>{} : make_iter<3>(out.sizes(), {&out, &a, &b}, op_name(op));
  auto it2 = scalar ? make_iter<2>(out.sizes(), {&out, &tensor}, op_name(op)) : StridedIter<2>{};
  dispatch<CudaAllTypes>(tensor.dtype(), op_name(op), [&]<typename T>() {
    using D = cuda_type_t<T>;
    constexpr DType dt = dtype_of_v<T>;
    if constexpr (dt == kBool) {
      GW_CHECK(is_comparison(op) || op == BinaryOp::Add || op == BinaryOp::Maximum ||
                   op == BinaryOp::Mul || op == BinaryOp::Minimum,
               DTypeError, "[", op_name(op), "] is not supported for bool tensors");
    } else if constexpr (!is_floating(dt)) {
      GW_CHECK(op != BinaryOp::Div, InternalError, "[", op_name(op), "] no CUDA kernel for dtype ",
               a.dtype());
    }
    auto scalar_value = [&] {  // the host scalar in the kernel's compute type
      if constexpr (is_half_v<D>) {
        if (scalar->dtype() == kFloat32) return *static_cast<const float*>(scalar->raw_data());
        return convert<float>(*static_cast<const T*>(scalar->raw_data()));
      } else {
        const T host = *static_cast<const T*>(scalar->raw_data());
        return static_cast<compute_t<D>>(host);
      }
    };
    auto run = [&](ErrorSlot err) {
      if constexpr (dt != kBool) {
        if (!is_comparison(op)) {
          const bool vectorized =
              scalar ? try_launch_vector<D, 1>(
                           out, {&tensor},
                           BinaryScalarValueFn<D>{op, err, scalar_value(), scalar_first}, on.stream)
                     : try_launch_vector<D, 2>(out, {&a, &b}, BinaryValueFn<D>{op, err}, on.stream);
          if (vectorized) return;
        }
      }
      if (scalar) {
        launch_strided(it2, BinaryScalarFn<D>{op, err, scalar_value(), scalar_first}, on.stream);
      } else {
        launch_strided(it3, BinaryFn<D>{op, err}, on.stream);
      }
    };
    if (!is_floating(dt) && dt != kBool && op == BinaryOp::Pow) {
      ErrorFlag flag(out.device(), on.stream);
      run(flag.slot());
      if (auto e = flag.check()) {
        throw InvalidArgumentError(detail::str(
            "[pow] integers to negative integer powers are not allowed (exponent ", *e, ")"));
      }
      return;
    }
    run(ErrorSlot{nullptr, nullptr});
  });
}

void CudaBackend::add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha,
                             const Tensor& out) {
  OnDevice on(out);
  auto it = make_iter<3>(out.sizes(), {&out, &a, &b}, "add");
  dispatch<CudaNumericTypes>(out.dtype(), "add", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const compute_t<D> scale = alpha.to<compute_t<D>>();
    if (try_launch_vector<D, 2>(out, {&a, &b}, AddScaledValueFn<D>{scale}, on.stream)) return;
    launch_strided(it, AddScaledFn<D>{scale}, on.stream);
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
