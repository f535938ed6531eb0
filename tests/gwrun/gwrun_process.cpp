// Spawning gwrun from the tests and collecting its output.
#include "tests/gwrun/gwrun_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace gw::test {
namespace {

// A hung gwrun fails the test with a message instead of hanging until meson's timeout.
constexpr int kReadTimeoutMs = 120'000;

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

// The NUL-separated entries of a file such as /proc/PID/environ; empty if it cannot be read.
std::vector<std::string> nul_separated(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> entries;
  for (std::string e; std::getline(in, e, '\0');) entries.push_back(e);
  return entries;
}

}  // namespace

pid_t GwrunProcess::worker_pid(int rank) const {
  const std::string self = std::to_string(pid_);
  std::ifstream children("/proc/" + self + "/task/" + self + "/children");
  for (pid_t child; children >> child;) {
    const auto env = nul_separated("/proc/" + std::to_string(child) + "/environ");
    const auto has = [&](const std::string& entry) {
      return std::find(env.begin(), env.end(), entry) != env.end();
    };
    if (has("GW_LAUNCHER=gwrun") && has("RANK=" + std::to_string(rank))) return child;
  }
  return -1;
}

GwrunProcess::GwrunProcess(const std::vector<std::string>& args,
                           const std::vector<std::string>& prefix) {
  int out[2], err[2];
  check(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, "pipe2");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  // Catch2 installs signal handlers; gwrun must start with the defaults and nothing blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> argv;
  for (const std::string& arg : prefix) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(const_cast<char*>(GW_GWRUN));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  started_ = std::chrono::steady_clock::now();
  int error = posix_spawnp(&pid_, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  errno = error;
  check(error == 0, "posix_spawn gwrun");
}

GwrunProcess::~GwrunProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

bool GwrunProcess::read_some() {
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  int ready = ::poll(fds, 2, kReadTimeoutMs);
  if (ready < 0 && errno == EINTR) return true;
  check(ready >= 0, "poll");
  if (ready == 0)
    throw std::runtime_error("gwrun (pid " + std::to_string(pid_) +
                             ") produced no output and did not exit in 120 s; its stdout:\n" +
                             result_.out + "its stderr:\n" + result_.err);
  int* fd_of[2] = {&out_fd_, &err_fd_};
  std::string* text_of[2] = {&result_.out, &result_.err};
  for (int i = 0; i < 2; ++i) {
    if (fds[i].revents == 0) continue;
    char buffer[1 << 16];
    ssize_t n = ::read(*fd_of[i], buffer, sizeof buffer);
    if (n > 0) {
      text_of[i]->append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(*fd_of[i]);
      *fd_of[i] = -1;  // poll() ignores negative fds
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool GwrunProcess::wait_for(const std::string& text, std::string_view needle) {
  while (text.find(needle) == std::string::npos) {
    if (!read_some()) return false;
  }
  return true;
}

int GwrunProcess::wait_for_any_stdout(const std::vector<GwrunProcess*>& processes,
                                      std::string_view needle) {
  for (;;) {
    std::vector<pollfd> fds;
    bool open = false;
    for (size_t i = 0; i < processes.size(); ++i) {
      const GwrunProcess& p = *processes[i];
      if (p.result_.out.find(needle) != std::string::npos) return static_cast<int>(i);
      fds.push_back({p.out_fd_, POLLIN, 0});
      fds.push_back({p.err_fd_, POLLIN, 0});
      open = open || p.out_fd_ >= 0 || p.err_fd_ >= 0;
    }
    if (!open) return -1;
    const int ready = ::poll(fds.data(), fds.size(), kReadTimeoutMs);
    if (ready < 0 && errno == EINTR) continue;
    check(ready >= 0, "poll");
    if (ready == 0) throw std::runtime_error("no gwrun produced output or exited in 120 s");
    for (size_t i = 0; i < processes.size(); ++i) {
      if (fds[2 * i].revents != 0 || fds[2 * i + 1].revents != 0) processes[i]->read_some();
    }
  }
}

GwrunResult GwrunProcess::finish() {
  while (read_some()) {
  }
  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid_, &status, 0);
  } while (waited < 0 && errno == EINTR);
  check(waited == pid_, "waitpid");
  pid_ = -1;
  result_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return result_;
}

GwrunResult run_gwrun(const std::vector<std::string>& args) { return GwrunProcess(args).finish(); }

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  return lines;
}

}  // namespace gw::test
