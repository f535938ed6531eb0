// What the distributed examples share: who this process is in its job, and the trainers'
// command-line flags.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dist/store/launch_env.h"

namespace gw::examples {

// Who this process is in its job, from whichever launcher started it (gwrun, torchrun, srun,
// mpirun, a PyTorchJob: gw::dist::detect_launch_env); without one, a job of one process. Exits
// with one line naming `program` when the environment is inconsistent.
dist::LaunchEnv launch_env(const char* program);

struct TrainArgs {
  int64_t epochs = 2, batch_size = 64, limit = 0;  // limit > 0: use only that many samples
  double lr = 0.02, target = 0.85;                  // target: the test accuracy to reach
};

// A program's own flags: takes (flag, value) and says whether it knew the flag.
using ExtraFlags = std::function<bool(const std::string& flag, const std::string& value)>;

// --epochs N --batch-size N --lr X --limit N --target ACCURACY over `defaults`, plus what
// `extra` knows (its flags listed in `extra_usage`); exits with the usage on anything else.
TrainArgs parse_train_args(const char* program, int argc, char** argv, TrainArgs defaults = {},
                           const ExtraFlags& extra = {}, const char* extra_usage = "");

}  // namespace gw::examples
