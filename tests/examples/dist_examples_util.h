// What the distributed examples' tests share (test_dist_examples.cpp, test_gpt_train_examples.cpp):
// a refusal before anything starts, and a worker killed at a line of its output.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/gwrun/gwrun_process.h"

namespace gw::test {

using Refusals = std::vector<std::pair<std::vector<std::string>, std::string>>;

// `example` with each case's flags, one rank under gwrun, refused before anything starts: a
// non-zero exit, the case's text on stderr, and no `started` line on stdout.
inline void check_refused(const std::string& example, const Refusals& cases,
                          const std::string& started) {
  for (const auto& [extra, says] : cases) {
    std::vector<std::string> a{"--nproc-per-node", "1", example};
    a.insert(a.end(), extra.begin(), extra.end());
    const auto refused = run_gwrun(a);
    INFO(refused.out << refused.err);
    CHECK(refused.exit_code != 0);
    CHECK(count(refused.err, says) >= 1);
    CHECK(count(refused.out, started) == 0);
  }
}

// Runs gwrun with `args` (--max-restarts among them), kills worker `rank` with SIGKILL once
// `line` is on its standard output, and waits for the job: its result, and the pid killed.
inline std::pair<gw::test::GwrunResult, pid_t> kill_worker_when(
    const std::vector<std::string>& args, const std::string& line, int rank) {
  gw::test::GwrunProcess job(args);
  REQUIRE(job.wait_for_stdout(line));
  const pid_t victim = job.worker_pid(rank);
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  return {job.finish(), victim};
}

}  // namespace gw::test
