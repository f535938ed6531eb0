// The worker supervision loop.
#include "tools/gwrun/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/error.h"
#include "tools/gwrun/worker_spawn.h"

namespace gw::gwrun {
namespace {

// A pipe whose read end gwrun polls (non-blocking) and whose write end only the worker keeps:
// gwrun closes its copy right after the spawn, or it would never see end of file.
struct Pipe {
  int read_fd = -1;
  int write_fd = -1;
  Pipe() {
    int fds[2];
    GW_CHECK(::pipe2(fds, O_CLOEXEC) == 0, IoError, "[gwrun] pipe2 failed: ", strerror(errno));
    read_fd = fds[0];
    write_fd = fds[1];
    ::fcntl(read_fd, F_SETFL, O_NONBLOCK);
  }
  ~Pipe() {
    if (read_fd >= 0) ::close(read_fd);
    ::close(write_fd);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int release_read() { return std::exchange(read_fd, -1); }
};

// "signal 9 (SIGKILL)": the number for scripts, the name for people.
std::string describe_signal(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  std::string name = abbrev != nullptr ? " (SIG" + std::string(abbrev) + ")" : "";
  return "signal " + std::to_string(sig) + name;
}

}  // namespace

Supervisor::Supervisor(LaunchOptions options, NodeRendezvous* nodes)
    : options_(std::move(options)), nodes_(nodes) {
  // Waiting for the other nodes, gwrun still answers Ctrl-C (the signal pipe has it now).
  if (nodes_ != nullptr) nodes_->set_interrupt([this] { return take_signals(); });
}

Supervisor::~Supervisor() {
  kill_alive(SIGKILL);
  // The guardian, destroyed after, is told of every group still watched when its pipe closes.
  for (Worker& worker : workers_) {
    if (worker.alive) ::waitpid(worker.pid, nullptr, 0);
  }
}

void Supervisor::start_round(int round) {
  const int cause = exit_code_;  // of the failure this round restarts after
  round_ = round;
  workers_.clear();
  stopping_ = false;
  exit_code_ = 0;
  kill_deadline_.reset();
  if (nodes_ != nullptr) {
    try {
      const NodeRendezvous::Place place = nodes_->join(round);
      options_.node_rank = place.node_rank;
      options_.master_addr = place.master_addr;
      options_.master_port = place.master_port;
    } catch (const NodeRendezvous::Stopped& stopped) {
      // Interrupted (on_signal saw to it), or the job ended, or another node failed already:
      // no workers this round, and run() decides as if they had been stopped. A restart that
      // cannot form ends with the failure it was for.
      if (stopped.failure) {
        end_round(*stopped.failure);
        if (cause != 0) exit_code_ = cause;
      }
      return;
    }
  }
  workers_.reserve(options_.nproc_per_node);
  if (hang_) hang_->start_round(options_.nproc_per_node);
  for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
    int rank = options_.rank_of(local_rank);
    std::string prefix = "[" + std::to_string(rank) + "] ";
    Pipe out, err;
    pid_t pid = spawn_process(
        options_.command,
        worker_environment(options_, local_rank, round,
                           hang_ ? hang_->environment(local_rank, rank)
                                 : std::vector<std::pair<std::string, std::string>>{}),
        StdFds{-1, out.write_fd, err.write_fd});
    guardian_->watch(pid);
    workers_.push_back(Worker{rank, pid, true,
                              LineForwarder(out.release_read(), STDOUT_FILENO, prefix),
                              LineForwarder(err.release_read(), STDERR_FILENO, prefix)});
  }
}

int Supervisor::run() {
  try {
    return run_rounds();
  } catch (const std::exception& e) {
    report({1, false, std::string("gwrun failed: ") + e.what()});
    leave_nodes(1);
    throw;
  }
}

int Supervisor::run_rounds() {
  guardian_.emplace(options_.term_timeout_s);
  try {
    hang_.emplace(options_.debug_on_timeout_s);
  } catch (const std::exception& e) {  // the job runs anyway, without the doctor
    write_all(STDERR_FILENO, std::string("[gwrun] no hang doctor: ") + e.what() + "\n");
  }
  start_round(0);
  for (;;) {  // bounded by --max-restarts
    int code = supervise();
    if (take_signals() && code == 0) code = exit_code_;  // one that came since the last poll
    if (code == 0 && nodes_ != nullptr && !nodes_lost_) {
      // Done here; the job is done when every node is, or goes on if one failed meanwhile.
      try {
        if (auto failure = nodes_->finish(round_)) {
          end_round(*failure);
          code = exit_code_;
        }
      } catch (const NodeRendezvous::Stopped&) {
        code = exit_code_;  // interrupted
      } catch (const std::exception& e) {
        lose_nodes(e);  // this node's workers succeeded: so did its part
      }
    }
    if (code == 0 || interrupted_ || nodes_lost_ || round_ >= options_.max_restarts) {
      leave_nodes(code);
      return code;
    }
    write_all(STDERR_FILENO, "[gwrun] restarting all workers (restart " +
                                 std::to_string(round_ + 1) + " of " +
                                 std::to_string(options_.max_restarts) + ")\n");
    start_round(round_ + 1);
  }
}

int Supervisor::supervise() {
  std::vector<pollfd> fds;
  std::vector<LineForwarder*> sources;
  while (any_alive()) {
    fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
    sources.clear();
    for (Worker& worker : workers_) {
      for (LineForwarder* source : {&worker.out, &worker.err}) {
        if (!source->is_open()) continue;
        fds.push_back(pollfd{source->fd(), POLLIN, 0});
        sources.push_back(source);
      }
    }
    int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    GW_CHECK(ready >= 0 || errno == EINTR, IoError, "[gwrun] poll failed: ", strerror(errno));
    if (ready > 0) {
      // Signals first: an interrupt that also killed workers is not reported as their failure.
      if (fds[0].revents != 0) take_signals();
      for (size_t i = 0; i < sources.size(); ++i) {
        if (fds[i + 1].revents != 0) sources[i]->pump(false);
      }
    }
    reap();  // every round, not only on SIGCHLD: a byte lost to a full pipe must not hang us
    if (nodes_ != nullptr && !nodes_lost_ && !stopping_ && Clock::now() >= next_watch_)
      watch_nodes();
    if (!stopping_ && hang_ && hang_->stalled(alive_by_local_rank())) on_stall();
    if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
      kill_alive(SIGKILL);
      kill_deadline_.reset();
    }
  }
  return exit_code_;
}

void Supervisor::watch_nodes() {
  next_watch_ = Clock::now() + NodeRendezvous::kPollPeriod;
  std::optional<NodeRendezvous::Failure> failure;
  try {
    failure = nodes_->failure(round_);
  } catch (const std::exception& e) {
    lose_nodes(e);
    return;
  }
  // Exit code 0: a node left after its workers finished; these may finish too.
  if (failure && failure->exit_code != 0) end_round(*failure);
}

void Supervisor::lose_nodes(const std::exception& e) {
  nodes_lost_ = true;
  write_all(STDERR_FILENO, std::string("[gwrun] lost the rendezvous: ") + e.what() +
                               "; no restart is possible now, the workers go on\n");
}

void Supervisor::end_round(const NodeRendezvous::Failure& failure) {
  write_all(STDERR_FILENO,
            "[gwrun] " + failure.description + (any_alive() ? "; stopping the workers\n" : "\n"));
  exit_code_ = failure.exit_code;
  interrupted_ = interrupted_ || !failure.restartable;
  stop(SIGTERM);
}

bool Supervisor::take_signals() {
  bool interrupt = false;
  for (int sig : signals_.take()) {
    on_signal(sig);
    interrupt = interrupt || sig == SIGINT || sig == SIGTERM;
  }
  return interrupt;
}

void Supervisor::leave_nodes(int exit_code) {
  if (nodes_ == nullptr || nodes_lost_) return;
  try {
    nodes_->leave(exit_code);
  } catch (const std::exception&) {
    // The store is gone: no node is left to tell.
  }
}

void Supervisor::report(const NodeRendezvous::Failure& failure) {
  if (nodes_ == nullptr || nodes_lost_) return;
  try {
    nodes_->fail_round(round_, failure);
  } catch (const std::exception& e) {
    lose_nodes(e);
  }
}

void Supervisor::on_signal(int sig) {
  if (sig != SIGINT && sig != SIGTERM) return;  // SIGCHLD only wakes poll(); reap() follows
  if (signalled_) {
    kill_alive(SIGKILL);  // a second Ctrl-C means "now"
    return;
  }
  // Whatever else is going on: no restart after this, here or on the other nodes.
  signalled_ = interrupted_ = true;
  report({128 + sig, false, "gwrun received " + describe_signal(sig)});
  std::string message =
      "[gwrun] received " + describe_signal(sig) + ", forwarding it to the workers\n";
  write_all(STDERR_FILENO, message);
  exit_code_ = 128 + sig;
  stop(sig);
}

void Supervisor::on_stall() {
  char window[32];
  std::snprintf(window, sizeof window, "%g", options_.debug_on_timeout_s);
  const std::string what = std::string("no worker has finished a collective or an RPC for ") +
                           window + " s while one waits (--debug-on-timeout)";
  write_all(STDERR_FILENO, "[gwrun] " + what + ": asking every worker for its debug info\n");
  print_diagnosis();
  write_all(STDERR_FILENO, "[gwrun] stopping the workers\n");
  exit_code_ = 1;
  stop(SIGTERM);
  report({exit_code_, true, "the job stalled: " + what});
}

void Supervisor::print_diagnosis() {
  std::vector<HangWatch::Target> targets;
  for (const Worker& w : workers_) targets.push_back({w.rank, w.pid, w.alive, w.exit});
  std::string text;
  for (const std::string& line : hang_->diagnose(targets))
    text += "[gwrun] hang doctor: " + line + "\n";
  write_all(STDERR_FILENO, text);
}

void Supervisor::reap() {
  for (Worker& worker : workers_) {
    if (!worker.alive) continue;
    // Seen exited but not reaped yet: its zombie still holds the group's number, so what is
    // left of its group can be killed without any risk of the number being someone else's.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(worker.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != worker.pid)
      continue;
    ::kill(-worker.pid, SIGKILL);  // what it started does not outlive it
    int status = 0;
    while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
    }
    on_exit(worker, status);
  }
}

void Supervisor::on_exit(Worker& worker, int status) {
  worker.alive = false;
  guardian_->forget(worker.pid);
  // Everything the worker wrote is in its pipes now; a grandchild still holding them must
  // not keep gwrun alive, so forward what is there and close.
  worker.out.pump(true);
  worker.err.pump(true);
  const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  std::string what = WIFSIGNALED(status) ? "was killed by " + describe_signal(WTERMSIG(status))
                                         : "exited with code " + std::to_string(code);
  worker.exit = what;
  if (code == 0 || stopping_) return;  // workers dying because we stopped them are no news
  exit_code_ = code;
  what =
      "rank " + std::to_string(worker.rank) + " (pid " + std::to_string(worker.pid) + ") " + what;
  // A worker whose collective or RPC timed out or failed dumped: the others may say why.
  const bool diagnose =
      hang_ && (options_.debug_on_timeout_s > 0 || hang_->dumped_on_failure(worker.rank));
  write_all(STDERR_FILENO, "[gwrun] " + what +
                               (diagnose ? "; asking the others for their debug info\n"
                                         : "; stopping the other workers\n"));
  if (diagnose) print_diagnosis();
  stop(SIGTERM);
  report({exit_code_, true, what});
}

void Supervisor::stop(int sig) {
  stopping_ = true;
  kill_alive(sig);
  kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.term_timeout_s));
}

void Supervisor::kill_alive(int sig) {
  // Only unreaped workers' groups: a reaped one's number may already be another's.
  for (const Worker& worker : workers_) {
    if (worker.alive) ::kill(-worker.pid, sig);
  }
}

std::vector<bool> Supervisor::alive_by_local_rank() const {
  std::vector<bool> alive;
  for (const Worker& worker : workers_) alive.push_back(worker.alive);
  return alive;
}

bool Supervisor::any_alive() const {
  for (const Worker& worker : workers_) {
    if (worker.alive) return true;
  }
  return false;
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> wake = kill_deadline_;
  if (nodes_ != nullptr && !nodes_lost_ && !stopping_)
    wake = std::min(wake.value_or(next_watch_), next_watch_);
  if (!stopping_ && hang_ && hang_->next_check() != Clock::time_point::max())
    wake = std::min(wake.value_or(hang_->next_check()), hang_->next_check());
  if (!wake) return -1;
  auto left = std::chrono::duration<double, std::milli>(*wake - Clock::now());
  return static_cast<int>(std::max(0.0, std::ceil(left.count())));
}

}  // namespace gw::gwrun
