// The guardian process and gwrun's handle on it.
#include "tools/gwrun/guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tools/gwrun/line_forwarder.h"
#include "tools/gwrun/worker_spawn.h"

extern char** environ;

namespace gw::gwrun {

Guardian::Guardian(double term_timeout_s) {
  int fds[2];
  GW_CHECK(::pipe2(fds, O_CLOEXEC) == 0, IoError, "[gwrun] pipe2 failed: ", std::strerror(errno));
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  try {
    GW_CHECK(null_fd >= 0, IoError, "[gwrun] cannot open /dev/null: ", std::strerror(errno));
    pid_ = spawn_process({"/proc/self/exe", kGuardianFlag, std::to_string(term_timeout_s)}, env,
                         StdFds{fds[0], null_fd, STDERR_FILENO});
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (null_fd >= 0) ::close(null_fd);
    throw;
  }
  ::close(fds[0]);
  ::close(null_fd);
  write_fd_ = fds[1];
}

Guardian::~Guardian() {
  ::close(write_fd_);
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::watch(pid_t pgid) { tell('+', pgid); }
void Guardian::forget(pid_t pgid) { tell('-', pgid); }

void Guardian::tell(char what, pid_t pgid) {
  // A guardian that died cannot be helped; gwrun carries on (its SIGPIPE is ignored).
  write_all(write_fd_, std::string(1, what) + std::to_string(pgid) + "\n");
}

namespace {

// Whether any process of group `pgid` is left.
bool group_alive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

}  // namespace

int run_guardian(int argc, char** argv) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
  const double grace_s = argc > 2 ? std::atof(argv[2]) : 5.0;
  std::set<pid_t> live;
  std::string pending;
  char buf[256];
  for (;;) {  // until gwrun's end of the pipe closes
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      const pid_t pgid = static_cast<pid_t>(std::atol(pending.c_str() + 1));
      if (pgid <= 1) continue;
      if (pending[0] == '+') live.insert(pgid);
      if (pending[0] == '-') live.erase(pgid);
    }
  }
  std::erase_if(live, [](pid_t g) { return !group_alive(g); });
  if (live.empty()) return 0;
  write_all(STDERR_FILENO, "[gwrun] gwrun exited without stopping its workers; stopping " +
                               std::to_string(live.size()) + " worker process group(s)\n");
  for (pid_t g : live) ::kill(-g, SIGTERM);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(grace_s));
  // Bounded by the grace period; the groups are not our children, so there is nothing to wait on.
  while (std::chrono::steady_clock::now() < until) {
    std::erase_if(live, [](pid_t g) { return !group_alive(g); });
    if (live.empty()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t g : live) ::kill(-g, SIGKILL);
  return 0;
}

}  // namespace gw::gwrun
