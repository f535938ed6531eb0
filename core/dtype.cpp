#include "core/dtype.h"

#include <bit>
#include <cmath>

namespace gw {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

namespace {
int rank_of(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::Int32: return 1;
    case DType::Int64: return 2;
    case DType::Float16:
    case DType::BFloat16: return 3;
    case DType::Float32: return 4;
    case DType::Float64: return 5;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::Float16 && b == DType::BFloat16) ||
      (a == DType::BFloat16 && b == DType::Float16)) {
    return DType::Float32;
  }
  return rank_of(a) >= rank_of(b) ? a : b;
}

float half_to_float(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {  // subnormal half: a normal float
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  return std::bit_cast<float>(bits);
}

Half float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf / nan (keep nans quiet)
    return Half{static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0))};
  }
  if (ax >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (ax < 0x38800000u) {  // below the smallest normal half: round to a subnormal
    float scaled = std::bit_cast<float>(ax) * 0x1.0p24f;  // units of 2^-24
    return Half{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  uint32_t mant_round = ax + 0xfffu + ((ax >> 13) & 1u);  // round to nearest even at bit 13
  return Half{static_cast<uint16_t>(sign | ((mant_round - 0x38000000u) >> 13))};
}

namespace detail {
void throw_unsupported_dtype(std::string_view op, DType t) {
  throw DTypeError(str("[", op, "] dtype ", t, " is not supported"));
}
}  // namespace detail

}  // namespace gw
