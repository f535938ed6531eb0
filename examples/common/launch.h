// What the distributed examples share: reading the variables gwrun sets for a worker, and the
// trainers' command-line flags.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gw::examples {

// The integer environment variable `name` (RANK, WORLD_SIZE, ...); exits with a message naming
// `program` when it is not set, i.e. when the program was not started by gwrun.
int env_int(const char* program, const char* name);

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
