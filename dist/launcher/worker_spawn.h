// Starting one worker process: its torch.distributed environment and posix_spawnp.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dist/launcher/options.h"

namespace gw::launcher {

// gwrun's own environment with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR and MASTER_PORT replaced by this worker's values (options.master_port resolved).
std::vector<std::string> worker_environment(const LaunchOptions& options, int local_rank);

// Starts command[0] (looked up in PATH) with its stdout and stderr on `out_fd` and `err_fd`.
// The worker stays in gwrun's process group, so a terminal's Ctrl-C reaches it directly as
// it would under torchrun. Throws InvalidArgumentError naming the program and the reason
// when it cannot be executed.
pid_t spawn_worker(const std::vector<std::string>& command, const std::vector<std::string>& env,
                   int out_fd, int err_fd);

}  // namespace gw::launcher
