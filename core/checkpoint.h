// A training run's state on disk, for resuming after a failure: the model's and the optimizer's
// tensors plus where the run was (epoch, step, the data order's seed).
//
// Mental model: a checkpoint is one safetensors file, <dir>/checkpoint.safetensors, whose
// tensors are "model/<name>" and "optimizer/<key>" and whose metadata holds the position.
// save_checkpoint writes it next to the old one and renames it into place (after fsync), so a
// crash mid-write leaves the previous checkpoint whole: a reader sees the old one or the new
// one, never a torn file. The metadata also holds the whole file's CRC-32C, and a checkpoint
// whose bytes have changed since (a bad disk, a copy cut short), in the tensors or in the header
// that names them and holds the position, is refused, not loaded.
// <dir>/checkpoint.json then repeats the metadata for people and scripts (load_checkpoint never
// reads it).
//
//   if (auto c = gw::load_checkpoint(dir)) {                 // resuming
//     model->load_state_dict(c->model);
//     opt.load_state_dict(c->optimizer);
//     first_epoch = c->epoch, first_step = c->step;
//   }
//   ...
//   gw::save_checkpoint(dir, {.model = model->state_dict(), .optimizer = opt.state_dict(),
//                             .epoch = epoch, .step = step + 1, .seed = seed, .extra = {}});
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/serialize.h"

namespace gw {

struct Checkpoint {
  NamedTensors model;                        // nn::Module::state_dict()
  NamedTensors optimizer;                    // optim::Optimizer::state_dict()
  int64_t epoch = 0;                         // where to resume: this epoch ...
  int64_t step = 0;                          // ... at this step (the first not yet taken)
  uint64_t seed = 0;                         // the data order's seed
  std::map<std::string, std::string> extra;  // anything else the program wants back
};

// Writes `c` into directory `dir` (created if missing) atomically, readable by this user only
// (mode 0600); throws IoError naming the path on failure, leaving any previous checkpoint
// intact, and InvalidArgumentError on a negative epoch or step.
void save_checkpoint(const std::string& dir, const Checkpoint& c);
// The checkpoint in `dir`, or nullopt if there is none; throws IoError naming the file if it
// exists but cannot be read or its checksum does not match (checkpoints of format 1, before the
// whole file was summed, are checked by their tensors' sum where they have one).
std::optional<Checkpoint> load_checkpoint(const std::string& dir);

// CRC-32C (Castagnoli, the checksum iSCSI, ext4 and most tools compute) of `size` bytes at
// `data`, continuing from `crc` (0 to start): what both kinds of checkpoints record.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);
// `crc` as the 8 lowercase hex digits the checkpoints record.
std::string crc32c_hex(uint32_t crc);

// Writes `size` bytes to `path` through a temporary file beside it (mode 0600): written, flushed
// to disk, renamed over `path`, and the directory flushed, so that `path` is always a whole
// file, old or new. On failure the temporary file is removed, `path` is untouched, and an
// IoError names `op` and the path.
void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const char* op);

}  // namespace gw
