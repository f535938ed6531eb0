#include "tests/process_util.h"

#include <spawn.h>
#include <sys/wait.h>

#include <csignal>

#include <cerrno>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace gw::test {

pid_t spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

PeerProcesses::PeerProcesses(const std::string& binary, int world_size, uint16_t store_port,
                             const std::vector<std::string>& extra) {
  for (int r = 1; r < world_size; ++r) {
    std::vector<std::string> argv{binary, std::to_string(r), std::to_string(world_size),
                                  std::to_string(store_port)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pids_.push_back(spawn(argv));
  }
}

PeerProcesses::~PeerProcesses() {
  for (pid_t p : pids_) ::kill(p, SIGKILL);
  wait();
}

std::vector<int> PeerProcesses::wait() {
  std::vector<int> codes;
  for (pid_t p : pids_) codes.push_back(wait_exit(p));
  pids_.clear();
  return codes;
}

}  // namespace gw::test
