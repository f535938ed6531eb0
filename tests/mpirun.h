// Runs a program under OpenMPI's real mpirun for a test: `mpirun -np <ranks> <command>`, bounded
// by `limit_s` seconds, with its output. Under ASan, OpenMPI's own leaks are suppressed
// (tests/lsan.supp), which needs whole stacks through its libraries: the fast unwinder stops in
// them, so the ranks get fast_unwind_on_malloc=0.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dist/process_group/init_process_group.h"
#include "tests/skip.h"

namespace gw::test {

struct MpiRun {
  std::string output;  // stdout and stderr
  int exit_code = -1;
};

// `mpirun_options`: e.g. "-x NAME=VALUE" for the ranks' environment.
inline MpiRun mpirun(int ranks, const std::string& command, const std::string& mpirun_options = "",
                     int limit_s = 120) {
  std::string cmd;
  if (const char* lsan = std::getenv("LSAN_OPTIONS"))
    cmd += "LSAN_OPTIONS='" + std::string(lsan) + ":fast_unwind_on_malloc=0' ";
  cmd += "timeout -k 5 " + std::to_string(limit_s) + " mpirun --oversubscribe " + mpirun_options +
         " -np " + std::to_string(ranks);
  if (::geteuid() == 0) cmd += " --allow-run-as-root";  // CI runs as root
  cmd += " " + command + " 2>&1";
  MpiRun run;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0;)
    run.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace gw::test

// Skips the test case, with the reason, in a build without MPI or on a machine without mpirun.
#define GW_SKIP_WITHOUT_MPIRUN()                               \
  do {                                                         \
    std::string why;                                           \
    if (!gw::dist::mpi_available(&why)) GW_SKIP(why);          \
    if (std::system("command -v mpirun >/dev/null 2>&1") != 0) \
      GW_SKIP("no mpirun (Debian: openmpi-bin)");              \
  } while (0)
