// What the distributed examples share: reading the variables gwrun sets for a worker, and the
// trainers' command-line flags.
#pragma once

#include <cstdint>

namespace gw::examples {

// The integer environment variable `name` (RANK, WORLD_SIZE, ...); exits with a message naming
// `program` when it is not set, i.e. when the program was not started by gwrun.
int env_int(const char* program, const char* name);

struct TrainArgs {
  int64_t epochs = 2, batch_size = 64, limit = 0;  // limit > 0: use only that many samples
  double lr = 0.02, target = 0.85;                  // target: the test accuracy to reach
};

// --epochs N --batch-size N --lr X --limit N --target ACCURACY; exits with the usage on
// anything else.
TrainArgs parse_train_args(const char* program, int argc, char** argv);

}  // namespace gw::examples
