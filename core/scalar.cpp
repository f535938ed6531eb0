#include "core/scalar.h"

#include <charconv>

#include "core/error.h"

namespace gw {

namespace detail {
namespace {
[[noreturn]] void refuse(const std::string& value, size_t bytes) {
  throw InvalidArgumentError(
      str("[Scalar] ", value, " cannot be converted to int", bytes * 8, " without overflow"));
}
}  // namespace
void throw_out_of_range(double value, size_t bytes) {
  char buf[32];  // every digit that tells the double apart: 2147483648, not 2.14748e+09
  refuse(std::string(buf, std::to_chars(buf, buf + sizeof buf, value).ptr), bytes);
}
void throw_out_of_range(int64_t value, size_t bytes) { refuse(std::to_string(value), bytes); }
}  // namespace detail

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return os << (s.to<bool>() ? "True" : "False");
    case Scalar::Kind::Int: return os << s.to<int64_t>();
    case Scalar::Kind::Float: return os << s.to<double>();
  }
  return os;
}

}  // namespace gw
