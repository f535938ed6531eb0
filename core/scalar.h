// A number passed to tensor operations (fill values, clamp bounds, `t + 2.5`). It remembers
// whether it was a bool, an integer or a floating value, which drives type promotion exactly
// like a Python number does in PyTorch: `int_tensor * 2` stays int64, `int_tensor * 2.5`
// becomes float32.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <ostream>
#include <type_traits>

#include "core/dtype.h"

namespace gw {

namespace detail {
// Throws InvalidArgumentError: `value` does not fit an integer of `bytes` bytes.
[[noreturn]] void throw_out_of_range(double value, size_t bytes, bool is_signed);
}  // namespace detail

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}  // NOLINT: implicit, like a Python number
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}  // NOLINT
  template <std::floating_point T>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_bool() const { return kind_ == Kind::Bool; }

  // The value as a T; the 16-bit floats round through float, as core's convert does.
  template <typename T>
  T to() const {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return convert<T>(to<float>());
    } else {
      if (kind_ == Kind::Float) {
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          // NaN or a value past T's range would be undefined: refused, as PyTorch does.
          constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
          constexpr double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
          if (!(d_ >= lo && d_ < hi))
            detail::throw_out_of_range(d_, sizeof(T), std::is_signed_v<T>);
        }
        return static_cast<T>(d_);
      }
      return static_cast<T>(i_);
    }
  }
  double to_double() const { return to<double>(); }

  // The dtype a tensor made from this scalar gets by default (bool, int64, float32).
  DType default_dtype() const {
    return kind_ == Kind::Float ? kFloat32 : kind_ == Kind::Int ? kInt64 : kBool;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace gw
