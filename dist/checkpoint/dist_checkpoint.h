// gw::dist::checkpoint — a training job's state saved by all its ranks at once, and loaded at
// any world size (torch.distributed.checkpoint).
//
// Mental model: a checkpoint is a directory holding a set of *logical tensors* — the whole
// model, the whole optimizer state — each with its name, dtype and shape, stored as *chunks*:
// runs of its elements in row-major order. Each rank writes the chunks it holds into a
// safetensors file of its own, and index.json says which file holds which elements of which
// tensor. A rank describes what it holds as a ShardedState: for every name, a tensor of its own
// and where those elements sit in the logical tensor (a whole tensor sits at 0). Replicas
// (DDP's parameters, every rank's same copy) are written once, spread over the ranks; pieces
// (ZeroRedundancyOptimizer's ranges of Adam's moments) are written by their owners and must
// cover the tensor. Loading asks, per name, for a range of elements — the one this rank holds
// now — and reads exactly those bytes from whichever files have them: the world size at load
// need not be the one at save.
//
//   namespace dcp = gw::dist::checkpoint;
//   // Saving, at world size 2 (every rank calls it):
//   dcp::ShardedState state = dcp::whole(model.module()->state_dict(), "model.");
//   state.merge(zero.sharded_state_dict("optim."));           // this rank's ranges of the moments
//   dcp::save("run/ckpt", state, *pg, {{"step", std::to_string(step)}});
//   // Loading, at world size 3, after building DDP and the optimizer as before:
//   dcp::Reader ckpt("run/ckpt");
//   dcp::load(ckpt, dcp::whole(model.module()->state_dict(), "model."), *pg);   // in place
//   zero.load_state_dict(ckpt, "optim.", *pg);                // each rank reads its new range
//   int64_t step = std::stoll(ckpt.metadata().at("step"));
//
// Models that live on other workers (RemoteModule) are written and read by their owners over
// RPC, driven by one caller (see the RemoteModule overloads below): a module placed on worker1
// at save may be on worker2 at load.
//
// Crash safety: files are named by a generation that each save increments (and a random nonce);
// each is written to a temporary name, flushed and renamed, and index.json — renamed into place
// last — is what makes a save visible. A save that fails on any rank raises on every rank and
// leaves the previous checkpoint whole; the files of older generations are removed once the new
// index is in place. Every rank must see the same directory (a shared file system across
// hosts), and one job at a time saves into it (a save that finds a newer index than its own
// when it is done refuses to replace it).
//
// Integrity: index.json records the CRC-32C of its own text and of every chunk's bytes, a MiB
// at a time. A Reader refuses an index whose text changed; a read checks every block it touches
// (reading whole the blocks its range starts or ends inside) and refuses one whose bytes changed
// with an IoError naming the file and the elements. Checkpoints of format 1, from before the
// checksums, are read unchecked.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors_file.h"
#include "core/serialize.h"
#include "dist/nn/remote_module.h"
#include "dist/process_group/process_group.h"

namespace gw::dist::checkpoint {

// Elements [offset, offset + local.numel()) of a logical tensor of `global_shape`, in row-major
// order; `local` may have any shape (a ZeRO range is flat; a whole tensor keeps its shape).
struct Shard {
  Tensor local;
  Shape global_shape;
  int64_t offset = 0;
};

// By logical name, e.g. "model.fc1.weight", "optim.state.0.exp_avg".
using ShardedState = std::map<std::string, Shard>;

// Every tensor of `tensors` as a whole, named "<prefix><name>": a module's state_dict (whose
// tensors are the live ones, so that load() fills the module in place) or an optimizer's.
ShardedState whole(const NamedTensors& tensors, const std::string& prefix = "");

// A collective over `group`: writes `state` (each rank's own) into directory `dir` (created if
// missing). Ranks that pass the same name must agree on its dtype and shape, and identical
// ranges are taken for copies of one another (written by one rank); the ranges of a name must
// together cover its tensor, without overlapping otherwise. `metadata` (rank 0's) is stored in
// the index. Checked on every rank from every rank's description before anything is written;
// any error raises on every rank, naming the rank and the tensor.
void save(const std::string& dir, const ShardedState& state, ProcessGroup& group,
          const std::map<std::string, std::string>& metadata = {});

// A checkpoint opened for reading: its index, and every file it names, opened at once (so a
// later save that replaces them does not pull them from under it).
class Reader {
 public:
  struct TensorInfo {
    DType dtype;
    Shape shape;
  };

  // IoError naming the directory when it holds no checkpoint, or a damaged one.
  explicit Reader(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t generation() const { return generation_; }
  int world_size() const { return world_size_; }  // of the job that saved it
  bool contains(const std::string& name) const { return tensors_.contains(name); }

  // Elements [offset, offset + dst.numel()) of logical tensor `name`, into `dst` (any shape,
  // device or layout, of the checkpoint's dtype). IndexError for an unknown name or a range
  // outside the tensor, InvalidArgumentError for another dtype, IoError naming the file when
  // bytes it read fail their checksum (what was read before stays in `dst`).
  void read(const std::string& name, const Tensor& dst, int64_t offset = 0) const;
  // The checks read(name, dst, offset) makes, without reading.
  void check(const std::string& name, const Tensor& dst, int64_t offset = 0) const;
  // Reads every block that elements [offset, offset + n) of `name` touch and checks it against
  // its sum, writing nothing: the IoError read() would raise for a damaged block, before any
  // live tensor is touched (format 1 has no sums: nothing is read).
  void verify(const std::string& name, int64_t offset, int64_t n) const;
  // The whole logical tensor `name`.
  Tensor read(const std::string& name) const;
  // Every tensor whose name starts with `prefix`, whole, named without it: e.g. a plain
  // optimizer's state_dict for Optimizer::load_state_dict.
  NamedTensors read_all(const std::string& prefix) const;

 private:
  struct Chunk {
    std::string file, key;
    int64_t offset = 0, numel = 0;
    std::vector<uint32_t> sums;  // CRC-32C of each block of its bytes (none in format 1)
  };
  const TensorInfo& info(const std::string& name) const;  // IndexError naming an unknown one
  const SafetensorsFile& file(const std::string& name) const;
  // The file of chunk `c` of tensor `name`, once it is seen to hold the chunk as the index says
  // (IoError otherwise).
  const SafetensorsFile& file_holding(const std::string& name, const Chunk& c) const;
  // IndexError unless elements [offset, offset + n) lie inside tensor `name`.
  void check_range(const std::string& name, int64_t offset, int64_t n) const;
  int64_t block_elements(const std::string& name) const;  // elements a block of its sums holds
  // IoError naming the file and the elements unless block `b` of chunk `c`, whose bytes are at
  // `bytes`, has the sum the index recorded.
  void check_block(const std::string& name, const Chunk& c, int64_t b, const uint8_t* bytes) const;
  // Elements [from, to) of chunk `c` of tensor `name` into `out`, each block they touch checked
  // against its sum (read whole where the range starts or ends inside it).
  void read_chunk(const std::string& name, const Chunk& c, int64_t from, int64_t to,
                  uint8_t* out) const;
  void open();  // reads the index, opens its files

  std::string dir_;
  int64_t generation_ = 0;
  int world_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::vector<Chunk>> chunks_;  // by name, in offset order
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // by name, opened at once
};

// A collective over `group`: fills every shard of `state` in place — shard.local gets elements
// [shard.offset, ...) of the checkpoint's tensor of that name, which must have shard's
// global_shape and local's dtype. Every rank checks every shard before any is read, and raises
// on every rank when any rank cannot load (a missing name, another shape or dtype), naming the
// rank and the tensor; nothing has changed then. The bytes are checked first too: every block
// a rank's ranges touch is read and checked against its sum (Reader::verify) before any is read
// into a live tensor, so a damaged block also raises on every rank with nothing changed. (Only
// a file that changes between the check and the read, or fails to read then, leaves what was
// read.) That costs a second read of the rank's bytes, from the page cache.
void load(const Reader& checkpoint, const ShardedState& state, ProcessGroup& group);
void load(const std::string& dir, const ShardedState& state, ProcessGroup& group);

// Runs `f` on every rank of `group` and agrees on the outcome (a collective): when it threw on
// any rank, every rank throws — that rank its own error, the others the first failing rank's as
// a RemoteFailure<E> naming it ("[rank 1] ..."), so that no rank trains on alone. What load(),
// ZeroRedundancyOptimizer::load_state_dict(Reader) and fully_shard's own checks use.
void on_every_rank(ProcessGroup& group, const std::function<void()>& f);

// --- RemoteModule: written and read by the modules' owners, over RPC -------------------------
// `modules` names a prefix for each module ("stage1." -> its parameters "stage1.weight", ...).

// From one worker (not a collective): every module's owner writes its module's state_dict into
// a file of its own in `dir`; this worker writes `local` (whole tensors or pieces that cover
// their tensors, e.g. its own model part) and then the index. Raises when any owner fails, and
// leaves the previous checkpoint whole.
void save(const std::string& dir, const std::map<std::string, RemoteModule>& modules,
          const ShardedState& local = {}, const std::map<std::string, std::string>& metadata = {});
// Every module's owner — wherever the module lives now — reads its state_dict from the
// checkpoint (strict: every parameter and buffer, of the same shapes), all at once; raises the
// first owner's error. The index and every module's bytes are checked here first, and then
// every owner checks that the checkpoint fits its module (the shapes, no missing or unexpected
// name), so a damaged or mismatched checkpoint loads no module. What only the reads find — a save
// that replaced the checkpoint since (each owner refuses it), tied parameters saved with
// different values — can leave the owners that loaded first.
void load(const std::string& dir, const std::map<std::string, RemoteModule>& modules);

namespace detail {
// Registers the functions save() and load() call on the modules' owners; every agent started by
// dist::init_rpc does it (dist/init_rpc.h).
void register_owner_functions();
}  // namespace detail

}  // namespace gw::dist::checkpoint
