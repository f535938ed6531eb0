#include "store/liveness.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "core/error.h"

namespace gw::store {

Milliseconds failure_timeout(Milliseconds option, const char* op) {
  Milliseconds t = option;
  if (option == kFailureTimeoutFromEnv) {
    t = kDefaultFailureTimeout;
    if (const char* v = std::getenv(kFailureTimeoutEnv); v != nullptr && *v != '\0') {
      const std::string_view text(v);
      double s = -1;  // from_chars: the same in every locale
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s);
      GW_CHECK(ec == std::errc() && end == text.data() + text.size() && std::isfinite(s) &&
                   s >= 0 && s < 1e6,
               InvalidArgumentError, "[", op, "] ", kFailureTimeoutEnv, "='", v,
               "' is not a number of seconds");
      t = Milliseconds(std::llround(s * 1000));
    }
  }
  GW_CHECK(t.count() >= 0, InvalidArgumentError, "[", op,
           "] failure_timeout must be >= 0 ms (0 = ", "never declare a peer dead), got ",
           t.count());
  GW_CHECK(t.count() == 0 || t.count() >= 500, InvalidArgumentError, "[", op,
           "] failure_timeout of ", t.count(), " ms is too short to tell a dead peer from a ",
           "busy machine (at least 500 ms; 0 turns liveness off)");
  return t;
}

std::string failure_window(Milliseconds failure_timeout) {
  std::ostringstream s;
  s << static_cast<double>(failure_timeout.count()) / 1000.0 << " s (failure_timeout)";
  return s.str();
}

std::string no_heartbeat_for(Milliseconds failure_timeout) {
  return "no heartbeat for " + failure_window(failure_timeout);
}

}  // namespace gw::store
