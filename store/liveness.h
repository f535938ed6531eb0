// How long a silent peer is given before it is declared dead: the one rule every layer that
// watches peers (RPC connections, process groups) shares.
//
// Mental model: on one host a dead process closes its sockets and its peers notice at once.
// Across hosts the common failure is silent (power lost, a link down, a process stopped): no
// FIN or RST ever comes. So each watcher expects to hear from each peer at least every
// `failure_timeout`; peers send a heartbeat whenever they have sent nothing else for a fifth
// of it, from a thread that runs no user computation, so a peer busy computing stays alive and
// one stopped briefly (for well under the window) is not declared dead. Every process of a job
// must use the same window (GW_FAILURE_TIMEOUT gives it to all of them).
//
//   Milliseconds t = gw::store::failure_timeout(options.failure_timeout, "init_rpc");
//   ... throw IoError("worker 'w1' declared dead: " + gw::store::no_heartbeat_for(t));
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

namespace gw::store {

using Milliseconds = std::chrono::milliseconds;

inline constexpr Milliseconds kDefaultFailureTimeout{10000};
// An option left at this takes GW_FAILURE_TIMEOUT (seconds, e.g. "2.5"), else the default.
inline constexpr Milliseconds kFailureTimeoutFromEnv{-1};
inline constexpr const char* kFailureTimeoutEnv = "GW_FAILURE_TIMEOUT";

// The failure timeout an option asks for: itself, or GW_FAILURE_TIMEOUT's, or the default; 0
// turns liveness off. Throws InvalidArgumentError naming `op` on a negative option or an
// unreadable variable, and on a window under 500 ms (a loaded machine's hiccups are longer).
Milliseconds failure_timeout(Milliseconds option, const char* op);

// How often a peer that has nothing else to send sends a heartbeat ...
inline Milliseconds heartbeat_period(Milliseconds failure_timeout) { return failure_timeout / 5; }
// ... and how often the watcher checks: often enough to declare a peer dead within
// failure_timeout + 0.5 s of its last sign of life.
inline Milliseconds liveness_check_period(Milliseconds failure_timeout) {
  return std::min(Milliseconds(500), failure_timeout / 10);
}

// Whether a check that came `since_last` after the previous one ran late: this process did not
// run meanwhile (stopped, starved), so the silence it sees says nothing of its peers, and it
// declares nobody dead on that round.
inline bool check_ran_late(std::chrono::steady_clock::duration since_last,
                           Milliseconds failure_timeout) {
  return since_last > failure_timeout / 2 + liveness_check_period(failure_timeout);
}

// "10 s (failure_timeout)", and "no heartbeat for 10 s (failure_timeout)": how a death is
// reported.
std::string failure_window(Milliseconds failure_timeout);
std::string no_heartbeat_for(Milliseconds failure_timeout);

}  // namespace gw::store
