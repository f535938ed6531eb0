// gwrun end to end: failing workers, signals and usage errors.
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include <cerrno>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/gwrun/gwrun_process.h"

using gw::test::GwrunProcess;
using gw::test::GwrunResult;
using gw::test::run_gwrun;

namespace {

// A FIFO in a fresh temporary directory: opening it blocks until both ends are opened, which
// lets one worker wait for another without sleeping.
class TempFifo {
 public:
  TempFifo() {
    char dir[] = "/tmp/gwrun_test_XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    dir_ = dir;
    path_ = dir_ + "/fifo";
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
  }
  ~TempFifo() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// The pid a worker printed as "[R] pid=N".
pid_t printed_pid(const std::string& out, int rank) {
  std::smatch match;
  std::regex pattern("\\[" + std::to_string(rank) + "\\] pid=([0-9]+)");
  REQUIRE(std::regex_search(out, match, pattern));
  return static_cast<pid_t>(std::stol(match[1]));
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Whether process `pid` (not necessarily our child) ends within `bound`: a pidfd becomes
// readable when its process exits (zombie or reaped, it no longer runs).
bool ends_within(pid_t pid, std::chrono::milliseconds bound) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;  // already gone
  pollfd p{fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(bound.count()));
  ::close(fd);
  return ready == 1;
}

// The pids a line pattern with one number captures, e.g. "child=([0-9]+)", in output order.
std::vector<pid_t> printed_pids(const std::string& out, const std::string& pattern) {
  std::vector<pid_t> pids;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return pids;
}

}  // namespace

TEST_CASE("gwrun exits with a failed worker's code after stopping the others", "[gwrun]") {
  TempFifo fifo;
  // Rank 0 only goes to sleep once rank 1 holds the FIFO, so rank 1 fails while 0 runs.
  std::string script = "if [ \"$RANK\" = 1 ]; then read x < " + fifo.path() +
                       "; exit 3; fi; echo pid=$$; echo go > " + fifo.path() + "; exec sleep 600";
  bool ignore_term = GENERATE(false, true);
  std::vector<std::string> args{"--nproc-per-node", "2", "sh", "-c", script};
  if (ignore_term) {  // rank 0 ignores SIGTERM: gwrun must escalate to SIGKILL
    args.back() = "trap '' TERM; " + script;
    args.insert(args.begin(), "--term-timeout=0.5");
  }
  GwrunResult r = run_gwrun(args);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("rank 1") != std::string::npos);
  CHECK(r.err.find("exited with code 3") != std::string::npos);
  CHECK(r.seconds < 300);  // a sanity bound far below the sleep, not a speed assertion
  if (ignore_term) CHECK(r.seconds >= 0.5);  // the grace period was honoured
  pid_t sleeper = printed_pid(r.out, 0);
  CHECK_FALSE(process_exists(sleeper));  // killed and reaped, not orphaned
}

TEST_CASE("gwrun reports a worker killed by a signal as 128+signal", "[gwrun]") {
  GwrunResult r = run_gwrun({"--nproc-per-node", "2", "sh", "-c",
                             "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 600"});
  INFO("stderr:\n" << r.err);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(r.err.find("rank 1") != std::string::npos);
  CHECK(r.err.find("signal 9") != std::string::npos);
  CHECK(r.seconds < 300);
}

TEST_CASE("gwrun exits 0 when every worker succeeds", "[gwrun]") {
  GwrunResult r = run_gwrun({"--nproc-per-node", "3", "sh", "-c", "exit 0"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.empty());
  CHECK(r.err.empty());
}

TEST_CASE("gwrun forwards SIGINT and SIGTERM to its workers", "[gwrun]") {
  int sig = GENERATE(SIGINT, SIGTERM);
  // Each worker waits for a child that sleeps, then reports the signal, stops the child and
  // exits 0: gwrun's own code must still say it was interrupted. The shell's `wait` takes a
  // signal that came before it began (a blocking `read` would miss one that came between
  // "ready" and the read, and block until gwrun's SIGKILL); a background child ignores SIGINT.
  GwrunProcess gwrun({"--nproc-per-node", "2", "sh", "-c",
                      "sleep 600 & trap 'echo got signal; kill $!; exit 0' INT TERM; "
                      "echo ready; wait $!"});
  REQUIRE(gwrun.wait_for_stdout("[0] ready"));
  REQUIRE(gwrun.wait_for_stdout("[1] ready"));
  REQUIRE(::kill(gwrun.pid(), sig) == 0);  // gwrun alone: only forwarding reaches the workers
  GwrunResult r = gwrun.finish();
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 128 + sig);
  CHECK(r.out.find("[0] got signal") != std::string::npos);
  CHECK(r.out.find("[1] got signal") != std::string::npos);
}

TEST_CASE("gwrun rejects bad usage with exit code 2, a reason and the usage", "[gwrun]") {
  struct Case {
    std::vector<std::string> args;
    std::string reason;
  };
  Case c = GENERATE(values<Case>({
      {{}, "missing --nproc-per-node"},
      {{"sh", "-c", "true"}, "missing --nproc-per-node"},
      {{"--nproc-per-node", "0", "true"}, "--nproc-per-node must be a number in [1, "},
      {{"--nproc-per-node=two", "true"}, "got 'two'"},
      {{"--nproc-per-node", "2"}, "no program to run"},
      {{"--nproc-per-node", "2", "--"}, "no program to run"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2", "true"},
       "--node-rank 2 is out of range for --nnodes 2"},
      {{"--nproc-per-node", "1", "--master-port", "70000", "true"}, "--master-port"},
      {{"--nproc-per-node", "1", "--bogus", "1", "true"}, "unknown option '--bogus'"},
  }));
  GwrunResult r = run_gwrun(c.args);
  INFO("stderr:\n" << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(c.reason) != std::string::npos);
  CHECK(r.err.find("usage: gwrun --nproc-per-node N") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE("gwrun reports a program it cannot execute", "[gwrun]") {
  struct Case {
    std::string program;
    int error;
  };
  Case c = GENERATE(values<Case>({{"gw-no-such-program-7f3a", ENOENT}, {"/dev/null", EACCES}}));
  GwrunResult r = run_gwrun({"--nproc-per-node", "2", c.program, "arg"});
  INFO("stderr:\n" << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("cannot execute '" + c.program + "': " + std::strerror(c.error)) !=
        std::string::npos);
}

TEST_CASE("gwrun --help prints the flags and exits 0", "[gwrun]") {
  GwrunResult r = run_gwrun({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("usage: gwrun") != std::string::npos);
  CHECK(r.out.find("--term-timeout") != std::string::npos);
  CHECK(r.err.empty());
}

TEST_CASE("SIGKILL to gwrun leaves no worker and no worker's child running", "[gwrun]") {
  // Each worker is a wrapper script with a child of its own: both must go.
  GwrunProcess gwrun({"--nproc-per-node", "2", "--term-timeout", "2", "sh", "-c",
                      "sleep 600 & echo child=$!; echo worker=$$; wait"});
  REQUIRE(gwrun.wait_for_stdout("[0] worker="));
  REQUIRE(gwrun.wait_for_stdout("[1] worker="));
  REQUIRE(::kill(gwrun.pid(), SIGKILL) == 0);
  GwrunResult r = gwrun.finish();
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == -SIGKILL);
  std::vector<pid_t> pids = printed_pids(r.out, "child=([0-9]+)");
  for (pid_t p : printed_pids(r.out, "worker=([0-9]+)")) pids.push_back(p);
  REQUIRE(pids.size() == 4);
  for (pid_t p : pids) CHECK(ends_within(p, std::chrono::seconds(30)));
  CHECK(r.err.find("gwrun exited without stopping its workers") != std::string::npos);
}

TEST_CASE("gwrun stops what a failed worker's wrapper started, and the others' too", "[gwrun]") {
  TempFifo fifo;
  // Rank 1 fails once rank 0 and its child run; every wrapper's child must be gone with it.
  GwrunResult r =
      run_gwrun({"--nproc-per-node", "2", "sh", "-c",
                 "sleep 600 & echo child=$!; if [ \"$RANK\" = 1 ]; then read x < " + fifo.path() +
                     "; exit 4; fi; echo go > " + fifo.path() + "; wait"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 4);
  const std::vector<pid_t> children = printed_pids(r.out, "child=([0-9]+)");
  REQUIRE(children.size() == 2);
  for (pid_t p : children) CHECK(ends_within(p, std::chrono::seconds(30)));
}

TEST_CASE("gwrun --max-restarts starts every worker again, up to N times", "[gwrun]") {
  // Rank 1 fails on the first two attempts.
  const std::string script =
      "echo attempt=$GW_RESTART_COUNT/$TORCHELASTIC_RESTART_COUNT; "
      "if [ \"$RANK\" = 1 ] && [ \"$GW_RESTART_COUNT\" -lt 2 ]; then exit 7; fi; exit 0";
  SECTION("enough restarts: the third attempt succeeds") {
    GwrunResult r = run_gwrun({"--max-restarts", "2", "--nproc-per-node", "2", "sh", "-c", script});
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.exit_code == 0);
    // Rank 0 may be stopped before it prints on a failed attempt; it completes the last.
    for (const char* a : {"attempt=0/0", "attempt=1/1", "attempt=2/2"})
      CHECK(gw::test::count(r.out, std::string("[1] ") + a) == 1);
    CHECK(gw::test::count(r.out, "[0] attempt=2/2") == 1);
    CHECK(gw::test::count(r.err, "restarting all workers") == 2);
  }
  SECTION("too few: the last failure's code") {
    GwrunResult r = run_gwrun({"--max-restarts=1", "--nproc-per-node", "2", "sh", "-c", script});
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.exit_code == 7);
    CHECK(gw::test::count(r.err, "restarting all workers (restart 1 of 1)") == 1);
    CHECK(gw::test::count(r.out, "attempt=2") == 0);
  }
}

namespace {
// Two gwrun "nodes" of one job on this machine, meeting at a loopback --rdzv-endpoint.
std::vector<std::unique_ptr<GwrunProcess>> start_nodes(const std::vector<std::string>& args,
                                                       const std::string& endpoint) {
  std::vector<std::unique_ptr<GwrunProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> argv = {"--nnodes", "2", "--rdzv-endpoint", endpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    nodes.push_back(std::make_unique<GwrunProcess>(argv));
  }
  return nodes;
}
}  // namespace

TEST_CASE("gwrun --max-restarts across nodes: every node restarts, the rendezvous forms again",
          "[gwrun]") {
  // On the first attempt global rank 2 (on whichever node is node 1 then) fails while the
  // others still run, so the other node must stop its workers when it hears of the failure.
  const std::string script =
      "echo attempt=$GW_RESTART_COUNT; if [ \"$GW_RESTART_COUNT\" = 0 ]; then "
      "if [ \"$RANK\" = 2 ]; then exit 7; fi; exec sleep 600; fi; exit 0";
  SECTION("a restart left: both nodes start their workers again and the job succeeds") {
    const gw::test::ReservedPort port;
    auto nodes = start_nodes({"--max-restarts", "2", "--nproc-per-node", "2", "sh", "-c", script},
                             port.endpoint());
    std::string all_out, all_err;
    for (auto& node : nodes) {
      const GwrunResult r = node->finish();
      INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
      CHECK(r.exit_code == 0);
      CHECK(gw::test::count(r.err, "restarting all workers (restart 1 of 2)") == 1);
      CHECK(gw::test::count(r.out, "attempt=1") == 2);  // both local workers, second round
      all_out += r.out, all_err += r.err;
    }
    // The failing node told the other, which stopped its running workers.
    CHECK(std::regex_search(all_err, std::regex("node 1: rank 2 \\(pid [0-9]+\\) exited with code "
                                                "7; stopping the workers")));
    for (const char* rank : {"[0] ", "[1] ", "[2] ", "[3] "})
      CHECK(gw::test::count(all_out, std::string(rank) + "attempt=1") == 1);
  }
  SECTION("no restart left: every node exits with the failure's code") {
    const gw::test::ReservedPort port;
    auto nodes = start_nodes({"--nproc-per-node", "2", "sh", "-c", script}, port.endpoint());
    for (auto& node : nodes) {
      const GwrunResult r = node->finish();
      INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
      CHECK(r.exit_code == 7);
      CHECK(gw::test::count(r.err, "restarting") == 0);
    }
  }
}

TEST_CASE("gwrun across nodes: an interrupted node ends the job on every node, no restart",
          "[gwrun]") {
  const gw::test::ReservedPort port;
  const std::string endpoint = port.endpoint();
  auto nodes = start_nodes(
      {"--max-restarts", "3", "--nproc-per-node", "1", "sh", "-c", "echo ready; exec sleep 600"},
      endpoint);
  for (auto& node : nodes) {
    const bool ready = node->wait_for_stdout("ready");
    INFO("stdout:\n" << node->so_far().out << "stderr:\n" << node->so_far().err);
    REQUIRE(ready);
  }
  // A stray third launch of the job is refused and leaves it alone.
  const GwrunResult stray = run_gwrun({"--nnodes", "2", "--rdzv-endpoint", endpoint,
                                       "--nproc-per-node", "1", "sh", "-c", "echo stray"});
  CHECK(stray.exit_code == 1);
  CHECK(gw::test::count(stray.err, "is running already with its 2 nodes") == 1);
  CHECK(stray.out.empty());
  REQUIRE(::kill(nodes[0]->pid(), SIGTERM) == 0);
  for (auto& node : nodes) {
    const GwrunResult r = node->finish();
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.exit_code == 128 + SIGTERM);
    CHECK(gw::test::count(r.err, "restarting") == 0);
  }
}

TEST_CASE("gwrun waiting for the other nodes still answers Ctrl-C", "[gwrun]") {
  const gw::test::ReservedPort port;
  const std::string endpoint = port.endpoint();
  // The other node never comes; the rendezvous alone would wait 10 minutes.
  GwrunProcess node({"--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-timeout", "600",
                     "--nproc-per-node", "1", "sh", "-c", "echo ran"});
  const bool waiting = node.wait_for_stderr("node 1 of 2 arrived, waiting for the others");
  INFO("stdout:\n" << node.so_far().out << "stderr:\n" << node.so_far().err);
  REQUIRE(waiting);
  REQUIRE(::kill(node.pid(), SIGINT) == 0);
  const GwrunResult r = node.finish();
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 128 + SIGINT);
  CHECK(r.seconds < 60);
  CHECK(r.out.find("ran") == std::string::npos);
}
