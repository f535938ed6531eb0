// Hyperparameter checks shared by the optimizers (internal; not installed). Messages name the
// optimizer, the option and the value, as torch.optim's ValueErrors do.
#pragma once

#include "core/error.h"

namespace gw::optim::detail {

// `!(value >= min)` also rejects NaN, which would otherwise poison every parameter silently.
inline void check_at_least(const char* op, const char* option, double value, double min = 0) {
  GW_CHECK(value >= min, InvalidArgumentError, "[", op, "] invalid ", option, ": ", value,
           " (must be >= ", min, ")");
}

// Betas and friends: averaging coefficients in [0, 1).
inline void check_unit_interval(const char* op, const char* option, double value) {
  GW_CHECK(value >= 0 && value < 1, InvalidArgumentError, "[", op, "] invalid ", option, ": ",
           value, " (must be in [0, 1))");
}

}  // namespace gw::optim::detail
