#include "core/scalar.h"

namespace gw {

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return os << (s.to<bool>() ? "True" : "False");
    case Scalar::Kind::Int: return os << s.to<int64_t>();
    case Scalar::Kind::Float: return os << s.to<double>();
  }
  return os;
}

}  // namespace gw
