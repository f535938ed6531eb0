// gwrun end to end: failing workers, signals and usage errors.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/dist/launcher/gwrun_process.h"

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
  TempFifo fifo;
  // Each worker blocks reading a FIFO nobody writes (no child process that could outlive
  // it), then reports the signal and exits 0: gwrun's own code must still say it was
  // interrupted.
  GwrunProcess gwrun({"--nproc-per-node", "2", "sh", "-c",
                      "trap 'echo got signal; exit 0' INT TERM; exec 3<> " + fifo.path() +
                          "; echo ready; read x <&3"});
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
