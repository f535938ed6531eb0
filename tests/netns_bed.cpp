#include "tests/netns_bed.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

extern char** environ;

namespace gw::test {
namespace {

// Runs `argv` (found on PATH) with its output discarded; its exit code (127: could not start).
int run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int error = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return 127;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void must(const std::vector<std::string>& argv) {
  if (run(argv) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    throw std::runtime_error("netns bed: `" + cmd + "` failed");
  }
}

// Removes the namespaces of beds whose test process died without tearing them down (killed by a
// timeout, say): "gwbed<pid>-..." with no process <pid>.
void remove_stale_beds() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("gwbed", 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + 5));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
      run({"ip", "netns", "del", name});
      std::filesystem::remove_all("/etc/netns/" + name, ec);
    }
  }
}

std::string unique_prefix() {
  static std::atomic<int> beds{0};
  return "gwbed" + std::to_string(::getpid()) + "-" + std::to_string(beds++);
}

}  // namespace

std::string NetnsBed::unavailable() {
  static const std::string why = [] {
    if (::geteuid() != 0) return std::string("network namespaces need root");
    if (run({"ip", "-V"}) != 0) return std::string("iproute2's `ip` is not installed");
    const std::string probe = unique_prefix() + "-probe";
    if (run({"ip", "netns", "add", probe}) != 0)
      return std::string("cannot create network namespaces here (no CAP_SYS_ADMIN?)");
    // (Names `ip` cannot take for keywords: "a" would be "address", "br" "broadcast".)
    const bool veth = run({"ip", "-n", probe, "link", "add", "probe0", "type", "veth", "peer",
                           "name", "probe1"}) == 0 &&
                      run({"ip", "-n", probe, "link", "add", "probebr", "type", "bridge"}) == 0;
    run({"ip", "netns", "del", probe});
    return veth ? std::string() : std::string("cannot create veth pairs or bridges here");
  }();
  return why;
}

NetnsBed::NetnsBed(int hosts) : prefix_(unique_prefix()), hosts_(hosts) {
  static const bool cleaned = (remove_stale_beds(), true);
  (void)cleaned;
  const std::string sw = prefix_ + "-sw";
  try {
    must({"ip", "netns", "add", sw});
    must({"ip", "-n", sw, "link", "add", "br0", "type", "bridge"});
    must({"ip", "-n", sw, "link", "set", "br0", "up"});
    for (int h = 0; h < hosts; ++h) {
      const std::string host = ns(h), port = "p" + std::to_string(h);
      must({"ip", "netns", "add", host});
      ++built_;
      // An address of its own before eth0, reachable from nowhere else: a host publishing its
      // first interface instead of the one that routes to the master is caught.
      // (A veth pair within the host: the dummy driver may be missing in a container.)
      must({"ip", "-n", host, "link", "add", "aux0", "type", "veth", "peer", "name", "aux1"});
      must({"ip", "-n", host, "addr", "add", "10.88.0." + std::to_string(h + 1) + "/24", "dev",
            "aux0"});
      must({"ip", "-n", host, "link", "set", "aux1", "up"});
      must({"ip", "-n", host, "link", "set", "aux0", "up"});
      must({"ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
            host});
      must({"ip", "-n", sw, "link", "set", port, "master", "br0", "up"});
      must({"ip", "-n", host, "link", "set", "lo", "up"});
      must({"ip", "-n", host, "addr", "add", ipv4(h) + "/24", "dev", "eth0"});
      must({"ip", "-n", host, "addr", "add", ipv6(h) + "/64", "dev", "eth0", "nodad"});
      must({"ip", "-n", host, "link", "set", "eth0", "up"});
    }
    // Every host's name resolves on every host (`ip netns exec` mounts this over /etc/hosts).
    std::string hosts_file = "127.0.0.1 localhost\n::1 localhost\n";
    for (int h = 0; h < hosts; ++h) hosts_file += ipv4(h) + " " + name(h) + "\n";
    for (int h = 0; h < hosts; ++h) {
      std::filesystem::create_directories("/etc/netns/" + ns(h));
      std::ofstream("/etc/netns/" + ns(h) + "/hosts") << hosts_file;
    }
  } catch (...) {
    teardown();
    throw;
  }
}

NetnsBed::~NetnsBed() { teardown(); }

void NetnsBed::teardown() {
  std::error_code ignored;
  for (int h = 0; h < built_; ++h) {
    run({"ip", "netns", "del", ns(h)});
    std::filesystem::remove_all("/etc/netns/" + ns(h), ignored);
  }
  built_ = 0;
  run({"ip", "netns", "del", prefix_ + "-sw"});  // takes the bridge and the cables with it
}

std::string NetnsBed::ns(int host) const { return prefix_ + "-h" + std::to_string(host); }

std::vector<std::string> NetnsBed::exec(int host) const {
  return {"ip", "netns", "exec", ns(host)};
}

void NetnsBed::set_link(int host, bool up) {
  must(
      {"ip", "-n", prefix_ + "-sw", "link", "set", "p" + std::to_string(host), up ? "up" : "down"});
}

}  // namespace gw::test
