// Hyperparameter checks shared by the optimizers (internal; not installed). Messages name the
// optimizer, the option and the value, as torch.optim's ValueErrors do.
#pragma once

#include <cmath>

#include "core/error.h"

namespace gw::optim::detail {

// NaN and infinity are refused too: either would poison every parameter silently.
inline void check_at_least(const char* op, const char* option, double value, double min = 0) {
  GW_CHECK(value >= min && std::isfinite(value), InvalidArgumentError, "[", op, "] invalid ",
           option, ": ", value, " (must be finite and >= ", min, ")");
}

// Betas and friends: averaging coefficients in [0, 1).
inline void check_unit_interval(const char* op, const char* option, double value) {
  GW_CHECK(value >= 0 && value < 1, InvalidArgumentError, "[", op, "] invalid ", option, ": ",
           value, " (must be in [0, 1))");
}

// The hyperparameters Adam and AdamW share (their options structs have the same fields).
template <typename Options>
void check_adam_options(const char* op, const Options& o) {
  check_at_least(op, "lr", o.lr);
  check_at_least(op, "eps", o.eps);
  check_unit_interval(op, "betas[0]", o.betas[0]);
  check_unit_interval(op, "betas[1]", o.betas[1]);
  check_at_least(op, "weight_decay", o.weight_decay);
}

}  // namespace gw::optim::detail
