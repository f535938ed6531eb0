// Supervisor: starts the local workers, forwards their output, and stops them all when one
// fails or gwrun is interrupted; with --max-restarts, then starts them all again. Each worker
// runs in a process group of its own, and stopping a worker stops its group (SIGTERM, then
// SIGKILL after --term-timeout), so a wrapper's children go with it; whatever is left in a
// worker's group when the worker exits is killed. A Guardian (guardian.h) stops the groups if
// gwrun dies first. Single-threaded: one poll() loop over the worker pipes and a signal
// self-pipe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <vector>

#include "dist/launcher/guardian.h"
#include "dist/launcher/line_forwarder.h"
#include "dist/launcher/options.h"
#include "dist/launcher/signal_pipe.h"

namespace gw::launcher {

class Supervisor {
 public:
  // options.master_port must be resolved (resolve_master_port).
  explicit Supervisor(LaunchOptions options);
  // Kills and reaps workers still running, e.g. when start() failed halfway.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every local rank. Throws InvalidArgumentError when the program cannot be executed.
  void start();
  // Returns once every worker has exited for good: 0, the first failed worker's exit code
  // (128+signal if it was killed) once no restart is left, or 128+signal when gwrun itself was
  // interrupted.
  int run();

 private:
  struct Worker {
    int rank;
    pid_t pid;
    bool alive;
    LineForwarder out;
    LineForwarder err;
  };
  using Clock = std::chrono::steady_clock;

  void start_workers(int restart_count);
  int supervise();  // one attempt: until every worker has exited
  void on_signal(int sig);
  void reap();
  void on_exit(Worker& worker, int status);
  void stop(int sig);
  void kill_alive(int sig);
  bool any_alive() const;
  int poll_timeout_ms() const;

  LaunchOptions options_;
  SignalPipe signals_;
  std::optional<Guardian> guardian_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  bool interrupted_ = false;  // gwrun got SIGINT or SIGTERM: no restart
  int exit_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;  // when stopping escalates to SIGKILL
};

}  // namespace gw::launcher
