// Supervisor: starts the local workers, forwards their output, and stops them all when one
// fails or gwrun is interrupted; with --max-restarts, then starts them all again. Each worker
// runs in a process group of its own, and stopping a worker stops its group (SIGTERM, then
// SIGKILL after --term-timeout), so a wrapper's children go with it; whatever is left in a
// worker's group when the worker exits is killed. A Guardian (guardian.h) stops the groups if
// gwrun dies first. Across nodes (--rdzv-endpoint) each attempt is a round of the node
// rendezvous (node_rendezvous.h): a failure here is reported to the other nodes, one reported
// there stops the workers here too, and every node starts its workers again in the next round.
// A HangWatch (hang_watch.h) gives the workers a place for their debug dumps and, with
// --debug-on-timeout, tells a stalled job; the doctor's diagnosis is printed before a stalled
// job is stopped, and before a failed one is when the failed worker dumped (its collective or
// RPC timed out). Single-threaded: one poll() loop over the worker pipes and a signal
// self-pipe (and, across nodes, a look at the rendezvous store every 250 ms).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <vector>

#include "tools/gwrun/guardian.h"
#include "tools/gwrun/hang_watch.h"
#include "tools/gwrun/line_forwarder.h"
#include "tools/gwrun/node_rendezvous.h"
#include "tools/gwrun/options.h"
#include "tools/gwrun/signal_pipe.h"

namespace gw::gwrun {

class Supervisor {
 public:
  // options.master_port must be resolved (resolve_master_port), unless `nodes` gives the
  // master each round; `nodes` (optional) must outlive the supervisor.
  explicit Supervisor(LaunchOptions options, NodeRendezvous* nodes = nullptr);
  // Kills and reaps workers still running, e.g. when run() failed halfway.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every local rank (after the rendezvous, across nodes) and returns once every worker
  // has exited for good: 0, the first failed worker's exit code (128+signal if it was killed)
  // once no restart is left, or 128+signal when gwrun itself was interrupted. Throws
  // InvalidArgumentError when the program cannot be executed, and what NodeRendezvous::join
  // throws (the other nodes are told the job ends).
  int run();
  // Its options, with this node's rank (across nodes, the rendezvous's).
  const LaunchOptions& options() const { return options_; }

 private:
  struct Worker {
    int rank;
    pid_t pid;
    bool alive;
    LineForwarder out;
    LineForwarder err;
    std::string exit = {};  // how it ended: "exited with code 1"
  };
  using Clock = std::chrono::steady_clock;

  int run_rounds();
  void start_round(int round);
  int supervise();     // one attempt: until every worker has exited
  void watch_nodes();  // across nodes: stops the workers when another node's failed
  void end_round(const NodeRendezvous::Failure& failure);  // another node's: stop ours
  bool take_signals();  // handles the signals that came; whether one was SIGINT or SIGTERM
  void report(const NodeRendezvous::Failure& failure);  // to the other nodes, if any
  void leave_nodes(int exit_code);                      // the job has ended here
  void lose_nodes(const std::exception& e);             // the store is gone: no restarts
  void on_signal(int sig);
  void on_stall();  // --debug-on-timeout passed without progress: diagnose, then stop
  void print_diagnosis();
  void reap();
  void on_exit(Worker& worker, int status);
  void stop(int sig);
  void kill_alive(int sig);
  bool any_alive() const;
  std::vector<bool> alive_by_local_rank() const;
  int poll_timeout_ms() const;

  LaunchOptions options_;
  NodeRendezvous* nodes_;
  SignalPipe signals_;
  std::optional<Guardian> guardian_;
  std::optional<HangWatch> hang_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  bool signalled_ = false;    // gwrun got SIGINT or SIGTERM: a second one kills at once
  bool interrupted_ = false;  // gwrun (or another node's) got one: no restart
  bool nodes_lost_ = false;   // the rendezvous store is gone: no restart either
  int round_ = 0;             // the attempt: GW_RESTART_COUNT
  int exit_code_ = 0;
  std::optional<Clock::time_point> kill_deadline_;  // when stopping escalates to SIGKILL
  Clock::time_point next_watch_{};                  // when watch_nodes() looks again
};

}  // namespace gw::gwrun
