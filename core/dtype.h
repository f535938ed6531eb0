// Element types and dtype dispatch.
//
// A DType names the element type of a tensor. Kernels are written once as templates and
// instantiated through `dispatch`, which maps a runtime DType to a compile-time type:
//
//   gw::dispatch<gw::AllTypes>(t.dtype(), "sum", [&]<typename T>() { ... T ... });
//
// The type list restricts which dtypes an operation accepts; any other dtype throws a
// DTypeError naming the operation. float16/bfloat16 exist as storage formats (CUDA kernels and
// safetensors files use them); CPU kernels do not compute in them.
#pragma once

#include <bit>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace gw {

enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;

// Bit patterns of the 16-bit float formats; arithmetic on them happens on devices that have it.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// IEEE conversions (round to nearest even), used by CPU copies into and out of 16-bit types.
float half_to_float(Half h);
Half float_to_half(float f);
// The bfloat16 ones are inline and branch-free, so that conversion loops vectorize (DDP's bf16
// compression converts every gradient twice per step).
inline float bfloat16_to_float(BFloat16 h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16);
}
inline BFloat16 float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return BFloat16{static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}

// float16 or bfloat16: storage types that compute in float32 (on the CPU through float32 copies).
constexpr bool is_16_bit_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
constexpr bool is_floating(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 ||
         t == DType::Float64;
}
constexpr bool is_integral(DType t, bool include_bool) {
  return t == DType::Int32 || t == DType::Int64 || (include_bool && t == DType::Bool);
}

std::string_view dtype_name(DType t);  // "float32", ...
std::ostream& operator<<(std::ostream& os, DType t);

// PyTorch's promotion lattice: bool < int32 < int64 < float16/bfloat16 < float32 < float64;
// float16 with bfloat16 gives float32.
DType promote_types(DType a, DType b);

template <typename T>
struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// The type used to accumulate sums of T: double for floats (accurate reductions), int64 for
// integers and bools (PyTorch's sum dtype; no int32 overflow).
template <typename T>
using acc_type_t = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <typename... Ts>
struct TypeList {};
using AllTypes = TypeList<float, double, int64_t, int32_t, bool>;
using NumericTypes = TypeList<float, double, int64_t, int32_t>;
using FloatTypes = TypeList<float, double>;
using IntegralTypes = TypeList<int64_t, int32_t>;
// Storage formats too: what copies and conversions accept.
using CopyTypes = TypeList<float, double, int64_t, int32_t, bool, Half, BFloat16>;

// static_cast, extended to the 16-bit float formats (through float).
template <typename D, typename S>
D convert(S v) {
  if constexpr (std::is_same_v<S, Half>) {
    return convert<D>(half_to_float(v));
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return convert<D>(bfloat16_to_float(v));
  } else if constexpr (std::is_same_v<D, Half>) {
    return float_to_half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, BFloat16>) {
    return float_to_bfloat16(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

namespace detail {
[[noreturn]] void throw_unsupported_dtype(std::string_view op, DType t);

template <typename F, typename T, typename... Rest>
decltype(auto) dispatch_impl(DType t, std::string_view op, F&& f) {
  if (t == dtype_of_v<T>) return f.template operator()<T>();
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_impl<F, Rest...>(t, op, std::forward<F>(f));
  } else {
    throw_unsupported_dtype(op, t);
  }
}

template <typename F, typename... Ts>
decltype(auto) dispatch_list(DType t, std::string_view op, F&& f, TypeList<Ts...>) {
  return dispatch_impl<F, Ts...>(t, op, std::forward<F>(f));
}
}  // namespace detail

// Calls f.template operator()<T>() with T the C++ type of `t`, if T is in List.
template <typename List, typename F>
decltype(auto) dispatch(DType t, std::string_view op, F&& f) {
  return detail::dispatch_list(t, op, std::forward<F>(f), List{});
}

}  // namespace gw
