// What the distributed examples share: who this process is in its job, and the trainers'
// command-line flags.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "core/checkpoint.h"

#include "store/launch_env.h"

namespace gw::examples {

// Who this process is in its job, from whichever launcher started it (gwrun, torchrun, srun,
// mpirun, a PyTorchJob: gw::store::detect_launch_env); without one, a job of one process. Exits
// with one line naming `program` when the environment is inconsistent.
store::LaunchEnv launch_env(const char* program);

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

// --checkpoint-every N --checkpoint-dir DIR, for the trainers that resume (gw::save_checkpoint):
// a checkpoint every N steps (0: none) in DIR (default "<program>.checkpoint").
struct CheckpointArgs {
  static constexpr const char* kUsage = " [--checkpoint-every N] [--checkpoint-dir DIR]";
  explicit CheckpointArgs(const char* program) : dir(std::string(program) + ".checkpoint") {}
  bool parse(const std::string& flag, const std::string& value);  // an ExtraFlags step
  // The checkpoint to resume from (none without --checkpoint-every); with `report`, says so.
  std::optional<Checkpoint> load(bool report) const;
  // Saves `c` and prints "checkpoint saved: epoch E, step S" (E counted from 1).
  void save(const Checkpoint& c) const;
  int64_t every = 0;
  std::string dir;
};

// --trace FILE: a timeline of the run (core/trace.h). Each rank writes FILE.rank<R>.json when
// it calls finish(); rank 0 then waits for the others' files and merges them into FILE, which
// opens at https://ui.perfetto.dev. (Under gwrun, GW_TRACE=FILE does the same for any program.)
struct TraceArgs {
  static constexpr const char* kUsage = " [--trace FILE]";
  bool parse(const std::string& flag, const std::string& value);  // an ExtraFlags step
  void start();                                                   // with --trace
  // Writes this rank's part; rank 0 merges the `world_size` parts (waiting up to a minute for
  // them) and says where the trace is.
  void finish(int rank, int world_size) const;
  std::string path;
  std::filesystem::file_time_type started{};  // older parts are a previous run's
};

}  // namespace gw::examples
