// Test helper: runs the real gwrun binary as a child of the test, capturing its stdout and
// stderr through pipes and its exit status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "store/net_address.h"

namespace gw::test {

struct GwrunResult {
  std::string out;
  std::string err;
  int exit_code = -1;  // gwrun's exit status, or -signal if gwrun itself was killed
  double seconds = 0;  // from start to exit
};

class GwrunProcess {
 public:
  // Runs `prefix... gwrun args...`: a prefix such as {"ip", "netns", "exec", "ns1"} runs gwrun
  // through another program (found on PATH), which must exec it.
  explicit GwrunProcess(const std::vector<std::string>& args,
                        const std::vector<std::string>& prefix = {});
  ~GwrunProcess();  // kills and reaps gwrun if a failed test left it running
  GwrunProcess(const GwrunProcess&) = delete;
  GwrunProcess& operator=(const GwrunProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The pid of gwrun's worker of global rank `rank` (a child of gwrun with GW_LAUNCHER=gwrun
  // and RANK=rank in its environment), or -1 if there is none now.
  pid_t worker_pid(int rank) const;
  // Reads output until stdout (stderr) contains `needle`; false if gwrun closed its pipes
  // first.
  bool wait_for_stdout(std::string_view needle) { return wait_for(result_.out, needle); }
  bool wait_for_stderr(std::string_view needle) { return wait_for(result_.err, needle); }
  // The same over several gwruns at once: the index of the first whose stdout contains
  // `needle`, or -1 once every one has closed its pipes.
  static int wait_for_any_stdout(const std::vector<GwrunProcess*>& processes,
                                 std::string_view needle);
  // What gwrun printed so far (exit_code and seconds are not known yet).
  const GwrunResult& so_far() const { return result_; }
  // Reads both pipes to end of file and waits for gwrun to exit.
  GwrunResult finish();

 private:
  // Reads what is available from the open pipes; false once both are closed.
  bool read_some();
  bool wait_for(const std::string& text, std::string_view needle);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  GwrunResult result_;
  std::chrono::steady_clock::time_point started_;
};

// Runs gwrun with `args` to completion.
GwrunResult run_gwrun(const std::vector<std::string>& args);

// A port of 127.0.0.1 held for the test while this lives (store::HeldPort), for an
// --rdzv-endpoint: gwrun's store can listen on it, and no concurrent test can take it first.
class ReservedPort {
 public:
  ReservedPort() : held_(store::hold_free_port("127.0.0.1", "ReservedPort")) {}
  int port() const { return held_.port(); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port()); }

 private:
  store::HeldPort held_;
};

// How many times `needle` occurs in `text`.
size_t count(const std::string& text, const std::string& needle);

// Splits `text` into lines without their newlines.
std::vector<std::string> split_lines(const std::string& text);

}  // namespace gw::test
