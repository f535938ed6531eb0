// Error logging for what cannot be raised to a caller (a callback that threw on another
// thread). Goes to stderr, one line, never stdout.
#pragma once

#include <iostream>

#include "core/error.h"

namespace gw {

template <typename... Args>
void log_error(const Args&... args) {
  std::cerr << ("[gradwire] " + detail::str(args...) + "\n") << std::flush;
}

}  // namespace gw
