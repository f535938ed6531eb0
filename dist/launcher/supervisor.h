// Supervisor: starts the local workers, forwards their output, and stops them all when one
// fails or gwrun is interrupted. Single-threaded: one poll() loop over the worker pipes and a
// signal self-pipe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <vector>

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
  // Returns once every worker has exited: 0, the first failed worker's exit code (128+signal
  // if it was killed), or 128+signal when gwrun itself was interrupted.
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

  void on_signal(int sig);
  void reap();
  void on_exit(Worker& worker, int status);
  void stop(int sig);
  void kill_alive(int sig);
  bool any_alive() const;
  int poll_timeout_ms() const;

  LaunchOptions options_;
  SignalPipe signals_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  int exit_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;  // when stopping escalates to SIGKILL
};

}  // namespace gw::launcher
