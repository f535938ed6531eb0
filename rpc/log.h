// Error logging for what cannot be raised to a caller (a bad frame from a peer, a connection
// that drops with nothing pending). Goes to stderr, one line, never stdout.
#pragma once

#include <iostream>

#include "core/error.h"

namespace gw::rpc {

template <typename... Args>
void log_error(const Args&... args) {
  std::cerr << ("[gradwire rpc] " + gw::detail::str(args...) + "\n") << std::flush;
}

}  // namespace gw::rpc
