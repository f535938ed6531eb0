// The MPI process group under OpenMPI's real mpirun: every collective at 2 and 3 ranks, the
// watchdog that ends a job whose collective passed its timeout, and a rank that dies.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <regex>
#include <string>

#include "dist/process_group/init_process_group.h"
#include "tests/mpirun.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

namespace {

using Run = gw::test::MpiRun;

// `mpirun -np <ranks> mpi_probe <scenario>`, bounded by 120 s; the ranks' flight-recorder
// dumps go to a directory of the test's.
Run mpirun(int ranks, const std::string& scenario) {
  gw::test::TempDir dumps("gw_mpi");
  return gw::test::mpirun(ranks, std::string(GW_MPI_PROBE) + " " + scenario,
                          "-x GW_DEBUG_DUMP_DIR=" + dumps.path);
}

#define SKIP_WITHOUT_MPI() GW_SKIP_WITHOUT_MPIRUN()

}  // namespace

TEST_CASE("every collective on the MPI group under mpirun -np 2 and -np 3", "[mpi][process]") {
  SKIP_WITHOUT_MPI();
  for (int ranks : {2, 3}) {
    INFO("mpirun -np " << ranks);
    const Run run = mpirun(ranks, "collectives");
    INFO(run.output);
    CHECK(run.exit_code == 0);
    for (int r = 0; r < ranks; ++r) {
      // Every rank ran its checks (the collectives alone are dozens) and none failed.
      std::smatch m;
      const std::regex line("rank " + std::to_string(r) + ": ([0-9]+) checks, ([0-9]+) failed");
      REQUIRE(std::regex_search(run.output, m, line));
      CHECK(std::stoi(m[1]) > 40);
      CHECK(m[2] == "0");
    }
  }
}

TEST_CASE("an MPI collective past its timeout aborts the job, naming it", "[mpi][process]") {
  SKIP_WITHOUT_MPI();
  const Run run = mpirun(2, "timeout");
  INFO(run.output);
  CHECK(run.exit_code == 1);  // MPI_Abort's
  CHECK(run.output.find("[allreduce] rank 0 of 2 in group default_pg: not completed within "
                        "1000 ms; MPI cannot cancel it: aborting the job") != std::string::npos);
  CHECK(run.output.find("the allreduce completed") == std::string::npos);
}

TEST_CASE("a rank that dies ends the MPI job with a non-zero exit code", "[mpi][process]") {
  SKIP_WITHOUT_MPI();
  const Run run = mpirun(2, "die");
  INFO(run.output);
  CHECK(run.exit_code == 3);  // the dead rank's, through mpirun
  CHECK(run.output.find("the allreduce completed") == std::string::npos);
}

TEST_CASE("a program that returns with an MPI collective in flight exits cleanly",
          "[mpi][process]") {
  SKIP_WITHOUT_MPI();
  const Run run = mpirun(2, "exit");
  INFO(run.output);
  CHECK(run.exit_code == 0);  // the collective finished, then MPI was finalized
  CHECK(run.output.find("failed") == std::string::npos);  // not refused at exit either
  CHECK(run.output.find("rank 1: returning with an allreduce in flight") != std::string::npos);
}

TEST_CASE("the mpi backend without MPI is refused, naming the build", "[mpi]") {
  std::string why;
  if (gw::dist::mpi_available(&why)) GW_SKIP("this build has MPI");
  CHECK_THROWS_WITH(gw::dist::init_process_group("mpi"),
                    Catch::Contains("backend 'mpi' is not available"));
}
