// Starting one worker process: its torch.distributed environment and posix_spawnp.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "tools/gwrun/options.h"

namespace gw::gwrun {

// gwrun's own environment with GW_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT), RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT replaced by
// this worker's values (options.master_port resolved).
// `extra` adds (or replaces) more: the hang watch's (hang_watch.h).
std::vector<std::string> worker_environment(
    const LaunchOptions& options, int local_rank, int restart_count,
    const std::vector<std::pair<std::string, std::string>>& extra = {});

// Where a child's standard streams go; -1 for stdin: gwrun's.
struct StdFds {
  int in = -1;
  int out = -1;
  int err = -1;
};

// Starts command[0] (looked up in PATH) with `fds`, in a process group of its own (its pgid is
// its pid), so that stopping it stops whatever it started too (a wrapper script's children):
// gwrun forwards a terminal's Ctrl-C to each group, as torchrun does. Nothing else of gwrun's
// is inherited: no other descriptor, no blocked or ignored signal. Throws InvalidArgumentError
// naming the program and the reason when it cannot be executed.
pid_t spawn_process(const std::vector<std::string>& command, const std::vector<std::string>& env,
                    const StdFds& fds);

}  // namespace gw::gwrun
