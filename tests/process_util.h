// Child processes for the multi-process tests of every suite.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include <string>
#include <vector>

namespace gw::test {

// Starts `argv[0]` with posix_spawn (no fork of this multi-threaded process).
pid_t spawn(const std::vector<std::string>& argv);
// Waits for the child; its exit code, or 128 + signal if it was killed.
int wait_exit(pid_t pid);

// Ranks 1..world_size-1 of a group as `binary <rank> <world_size> <store_port> <extra...>`
// processes (the test process is rank 0 and runs the store). Kills and reaps whatever is left
// when destroyed.
class PeerProcesses {
 public:
  PeerProcesses(const std::string& binary, int world_size, uint16_t store_port,
                const std::vector<std::string>& extra = {});
  ~PeerProcesses();
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  // Exit code of every peer (128 + signal when killed), in rank order.
  std::vector<int> wait();
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace gw::test
