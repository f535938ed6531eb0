// The hang doctor end to end: real processes under the real gwrun, each stall built on purpose
// by hang_probe.cpp, and the diagnosis gwrun prints checked word for word where it matters.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "tests/gwrun/gwrun_process.h"
#include "tests/temp_dir.h"

namespace {

using gw::test::count;
using gw::test::GwrunResult;
using gw::test::run_gwrun;

GwrunResult run_probe(int nproc, const std::string& scenario,
                      const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(nproc), "--term-timeout",
                                   "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(GW_HANG_PROBE);
  args.push_back(scenario);
  return run_gwrun(args);
}

}  // namespace

TEST_CASE("the hang doctor names the rank in another collective", "[hang_doctor]") {
  GwrunResult r = run_probe(3, "collectives", {"--debug-on-timeout", "2"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code != 0);
  // Gloo may hang on the mismatch or fail on it (and a rank may get through): the doctor names
  // the two sides either way.
  const std::regex desync(
      "hang doctor: collectives on default_pg: rank 1 (is in|failed in|called) allreduce #1 "
      "\\[4096\\] float32 while ranks 0, 2 (are in|failed in|called) broadcast #1 \\[4096\\] "
      "float32 root 0: every rank must call the same collectives");
  CHECK(std::regex_search(r.err, desync));
  CHECK(r.err.find("the ranks' debug info is in") != std::string::npos);
  CHECK(r.seconds < 60);
}

TEST_CASE("GW_DISTRIBUTED_DEBUG=DETAIL raises on every rank, naming both signatures",
          "[hang_doctor]") {
  ::setenv("GW_DISTRIBUTED_DEBUG", "DETAIL", 1);
  GwrunResult r = run_probe(3, "shapes");
  ::unsetenv("GW_DISTRIBUTED_DEBUG");
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 1);
  const std::string error =
      "collective #1 differs across ranks: rank 0 calls allreduce [4] float32 but rank 1 calls "
      "allreduce [8] float32";
  // Every rank raised before anything was reduced (or could hang), rank 1 included.
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    CHECK(r.out.find("[" + std::to_string(rank) +
                     "] raised: [allreduce] GW_DISTRIBUTED_DEBUG="
                     "DETAIL: " +
                     error) != std::string::npos);
  }
  CHECK(r.seconds < 60);
}

TEST_CASE("the hang doctor names a silent rank", "[hang_doctor]") {
  GwrunResult r = run_probe(3, "silent", {"--debug-on-timeout", "2"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("no worker has finished a collective or an RPC for 2 s") != std::string::npos);
  CHECK(r.err.find("hang doctor: rank 1 sent no debug info within 5 s") != std::string::npos);
  CHECK(r.err.find("ranks 0, 2 are in allreduce #1 [16] float32") != std::string::npos);
  CHECK(r.seconds < 60);
}

TEST_CASE("the hang doctor finds a cycle of blocking RPCs", "[hang_doctor]") {
  GwrunResult r = run_probe(3, "rpc-cycle", {"--debug-on-timeout", "2"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("rpc: worker0 → worker1 → worker2 → worker0: every worker's pool is busy "
                   "waiting on the next") != std::string::npos);
  CHECK(r.seconds < 60);
}

TEST_CASE("monitored_barrier names the rank that did not arrive", "[hang_doctor]") {
  GwrunResult r = run_probe(3, "barrier");
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 1);
  CHECK(count(r.out, "raised: [monitored_barrier] rank 2 did not arrive within 1000 ms") == 2);
  CHECK(r.seconds < 60);
}

TEST_CASE("a plain failure gets no diagnosis and leaves nothing behind", "[hang_doctor]") {
  gw::test::TempDir dumps;
  ::setenv("GW_DEBUG_DUMP_DIR", dumps.path.c_str(), 1);
  // The workers fail before any collective: nothing timed out, no worker is asked for a dump.
  GwrunResult r = run_probe(2, "no-such-scenario");
  ::unsetenv("GW_DEBUG_DUMP_DIR");
  INFO("stderr:\n" << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("hang doctor") == std::string::npos);
  CHECK(r.err.find("debug info") == std::string::npos);
  CHECK(std::filesystem::is_empty(dumps.path));
}

TEST_CASE("--debug-on-timeout leaves alone a job that computes longer than the window",
          "[hang_doctor]") {
  // Collectives, then 2 s with nothing pending, then collectives again: not a stall.
  GwrunResult r = run_probe(2, "compute", {"--debug-on-timeout", "1"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "completed") == 2);
  CHECK(r.err.find("hang doctor") == std::string::npos);
}
