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
#include <utility>

#include "core/dtype.h"

namespace gw {

namespace detail {
// Throw InvalidArgumentError: `value` does not fit a signed integer of `bytes` bytes.
[[noreturn]] void throw_out_of_range(double value, size_t bytes);
[[noreturn]] void throw_out_of_range(int64_t value, size_t bytes);
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
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        // NaN or a value past T's range would be undefined, or wrap: refused, as PyTorch does.
        constexpr auto lo = std::numeric_limits<T>::min();
        constexpr auto hi = std::numeric_limits<T>::max();
        if (kind_ == Kind::Float &&
            !(d_ >= static_cast<double>(lo) && d_ < static_cast<double>(hi) + 1.0))
          detail::throw_out_of_range(d_, sizeof(T));
        if (kind_ == Kind::Int && (std::cmp_less(i_, lo) || std::cmp_greater(i_, hi)))
          detail::throw_out_of_range(i_, sizeof(T));
      }
      if (kind_ == Kind::Float) return static_cast<T>(d_);
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
