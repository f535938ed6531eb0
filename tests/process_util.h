// Child processes for the multi-process tests of every suite.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace gw::test {

// Starts `argv[0]` with posix_spawn (no fork of this multi-threaded process).
pid_t spawn(const std::vector<std::string>& argv);
// Waits for the child; its exit code, or 128 + signal if it was killed.
int wait_exit(pid_t pid);

}  // namespace gw::test
