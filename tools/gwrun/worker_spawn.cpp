// Worker environment and process creation.
#include "tools/gwrun/worker_spawn.h"

#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "tools/gwrun/signal_pipe.h"

extern char** environ;

namespace gw::gwrun {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> result;
  result.reserve(strings.size() + 1);
  for (const std::string& s : strings) result.push_back(const_cast<char*>(s.c_str()));
  result.push_back(nullptr);
  return result;
}

}  // namespace

std::vector<std::string> worker_environment(
    const LaunchOptions& options, int local_rank, int restart_count,
    const std::vector<std::pair<std::string, std::string>>& extra) {
  int n = options.nproc_per_node;
  std::array<std::pair<const char*, std::string>, 11> vars{{
      {"GW_LAUNCHER", "gwrun"},
      {"GW_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"RANK", std::to_string(options.rank_of(local_rank))},
      {"WORLD_SIZE", std::to_string(options.nnodes * n)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(n)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
  }};
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view name(*entry, std::strcspn(*entry, "="));
    bool overridden = false;
    for (const auto& var : vars) overridden = overridden || name == var.first;
    for (const auto& var : extra) overridden = overridden || name == var.first;
    if (!overridden) env.emplace_back(*entry);  // a stale RANK must not shadow the new one
  }
  for (const auto& [name, value] : vars) env.push_back(std::string(name) + "=" + value);
  for (const auto& [name, value] : extra) env.push_back(name + "=" + value);
  return env;
}

pid_t spawn_process(const std::vector<std::string>& command, const std::vector<std::string>& env,
                    const StdFds& fds) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (fds.in >= 0) posix_spawn_file_actions_adddup2(&actions, fds.in, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds.out, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds.err, STDERR_FILENO);
  // Nothing else of gwrun's: the rendezvous store's sockets (Asio opens them without
  // close-on-exec) would outlive a killed gwrun in its workers and hold the port.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);

  // gwrun's handlers vanish at exec anyway, but its ignored SIGPIPE and any blocked signals
  // would be inherited.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : SignalPipe::handled_signals()) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, led by the child
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);

  std::vector<char*> argv = c_strings(command);
  std::vector<char*> envp = c_strings(env);
  pid_t pid = -1;
  // glibc reports exec failures here (not as exit status 127), so they are usage errors.
  int error = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  GW_CHECK(error == 0, InvalidArgumentError, "[gwrun] cannot execute '", command[0],
           "': ", std::strerror(error));
  return pid;
}

}  // namespace gw::gwrun
