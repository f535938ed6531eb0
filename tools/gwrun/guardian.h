// Guardian: a small process that stops gwrun's workers if gwrun dies without stopping them
// (SIGKILL, the OOM killer, a scheduler killing it).
//
// Mental model: each worker runs in a process group of its own, and the guardian knows which
// groups are live: gwrun tells it through a pipe ("+pgid" when a worker starts, "-pgid" once
// its group is gone). The guardian only reads that pipe. When it reads end of file — gwrun
// exited, however it died — it sends SIGTERM to every live group, waits up to the grace
// period, sends SIGKILL to what is left, and exits. A parent-death signal would reach only a
// worker, not what a wrapper script started; the guardian reaches the whole group. It is gwrun
// itself, run with a hidden flag, in its own process group and deaf to SIGINT, SIGTERM and
// SIGHUP, so that signals meant for gwrun or its terminal do not take it first.
//
//   Guardian guardian(options.term_timeout_s);  // spawned
//   guardian.watch(pid);                        // a worker started (its pgid is its pid)
//   guardian.forget(pid);                       // its group is gone
#pragma once

#include <sys/types.h>

namespace gw::gwrun {

// The hidden first argument that makes gwrun a guardian.
inline constexpr const char* kGuardianFlag = "--gwrun-guardian";

class Guardian {
 public:
  // Starts the guardian (gwrun's own executable); throws IoError if it cannot.
  explicit Guardian(double term_timeout_s);
  // Closes the pipe (the guardian stops whatever is still watched) and reaps it.
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(pid_t pgid);
  void forget(pid_t pgid);

 private:
  void tell(char what, pid_t pgid);

  pid_t pid_ = -1;
  int write_fd_ = -1;
};

// The guardian's main: `argv` is gwrun's, starting with kGuardianFlag and the grace seconds.
int run_guardian(int argc, char** argv);

}  // namespace gw::gwrun
