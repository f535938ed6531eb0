#include "core/scalar.h"

#include "core/error.h"

namespace gw {

namespace detail {
void throw_out_of_range(double value, size_t bytes, bool is_signed) {
  throw InvalidArgumentError(str("[Scalar] ", value, " cannot be converted to ",
                                 is_signed ? "int" : "uint", bytes * 8, " without overflow"));
}
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
