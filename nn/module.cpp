#include "nn/module.h"

namespace gw::nn {

Tensor Module::forward(const Tensor&) {
  throw StateError(detail::str("[", type_name_, "] forward(Tensor) is not implemented"));
}

}  // namespace gw::nn
