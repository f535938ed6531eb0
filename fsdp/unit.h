// fully_shard's internal state (not installed): a unit's sharded parameters and where their
// rows live, the unit's gathering and reducing, and what the units under one root share.
// fsdp/fully_shard.cpp runs them around a module's calls and backward; fsdp/state_dict.cpp
// reads them for checkpoints.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/process_group/process_group.h"
#include "fsdp/fully_shard.h"
#include "nn/module.h"

namespace gw::fsdp::detail {

struct Root;

// One parameter of a unit, and where its rows live. Rank r holds rows
// [r * rows_per_rank, (r + 1) * rows_per_rank) of it, clipped to `rows`; in every rank's chunk
// of the unit's flat buffers those rows start at `offset` (elements), padded to rows_per_rank.
struct ShardedParam {
  std::string name;                                         // dotted, from the unit's module
  std::vector<std::pair<nn::Module*, std::string>> owners;  // the registrations it replaces
  Tensor full;       // what the members hold: gathered around calls and backward, else released
  Tensor shard;      // this rank's rows, a view of the unit's shard buffer, registered in its place
  int64_t rows = 0;  // dim 0 (1 for a scalar)
  int64_t row_numel = 1;
  int64_t rows_per_rank = 0;
  int64_t offset = 0;       // in a rank's chunk
  int64_t full_offset = 0;  // in the gathered parameters, one after another
  // requires_grad as both handles had it at the last gather: the user may freeze either, the
  // registered shard (parameters()) or the module's member (the whole one).
  bool requires_grad = true;
  // The sum of the whole gradients that backward passes without gradient sync left, in the
  // unit's reduce_dtype where it differs from compute_dtype (FSDP2's unsharded accumulated
  // gradient): bfloat16 gradients summed in bfloat16, micro-batch after micro-batch, would lose
  // what the float32 reduction keeps. Undefined otherwise: the member's .grad holds the sum.
  Tensor accumulated;

  int64_t rows_of(int rank) const {
    return std::clamp<int64_t>(rows - rank * rows_per_rank, 0, rows_per_rank);
  }
  // Where rank's rows start in the whole parameter, flattened (its end when it has none).
  int64_t start_of(int rank) const { return std::min(rank * rows_per_rank, rows) * row_numel; }
};

// The state of one module given to fully_shard. All of it is used on the thread that runs the
// model (forward, and backward's hooks, which run on the thread that called backward).
struct Unit : std::enable_shared_from_this<Unit> {
  std::shared_ptr<dist::ProcessGroup> group;
  nn::Module* module = nullptr;  // owns this unit through its hooks
  std::string type_name;
  FullyShardOptions options;
  std::vector<ShardedParam> params;
  DType dtype = kFloat32;          // the shards'
  DType compute_dtype = kFloat32;  // the gathered parameters' (the policy's param_dtype)
  DType reduce_dtype = kFloat32;   // the reductions'
  int64_t chunk = 0;               // elements of one rank's shards, padded
  int64_t full_numel = 0;          // elements of the gathered parameters
  Tensor shard_buffer;  // (chunk + kTagLength): this rank's shards back to back, which the
                        // shards view, then the tag of the gather it goes into (on the group's
                        // device, or the CPU under a CPUOffloadPolicy)
  size_t position = 0;  // among its root's units, the same on every rank
  bool sync = true;
  std::shared_ptr<Root> root;

  // Gathering: the all-gather in flight and the buffer it fills (every rank's shard buffer in
  // rank order), then `gathered` once the members view their rows.
  //
  // Each rank's part of a gather ends with a tag naming what it gathers: the unit's position
  // and what for, as kTagLength integers below 128, which every floating dtype holds exactly.
  // A gather copies, so each rank reads back every rank's tag and compares it with its own:
  // ranks that call units in different orders (a unit called on some ranks only, a backward
  // that failed on one rank) would otherwise pair the gathers of different units of one size
  // and compute with another unit's parameters, silently. On the CPU (Gloo, MPI) the tags are
  // read when the gather ends; on a device, at the end of backward (or the next forward), when
  // the host waits for the device anyway.
  enum class GatherFor { kForward = 1, kBackward = 2, kUnshard = 3, kState = 4 };
  static constexpr int64_t kTagLength = 4;
  dist::WorkPtr gather_work;
  Tensor gathering;
  GatherFor gathering_for = GatherFor::kForward;
  bool gathered = false;

  // Reduce-scatters issued by this backward, written into the shards' .grad at its end. Each
  // rank's chunk of a reduction carries, after the gradients, one count per parameter: how many
  // ranks had a gradient for it, so that a parameter no rank used keeps no .grad, as it would
  // without sharding.
  struct Reduction {
    Tensor output;  // (chunk + params): this rank's summed rows, then the counts
    dist::WorkPtr work;
  };
  std::vector<Reduction> reductions;
  bool reduced = false;  // this backward reduced it at least once

  int world() const { return group->size(); }
  int rank() const { return group->rank(); }
  bool is_root() const;

  // The shards in compute_dtype where the collectives run: copied from host memory first when
  // they are offloaded, then converted on the device.
  Tensor on_group_device(const Tensor& shards) const {
    return shards.to(group->device()).to(compute_dtype);
  }
  void start_gather(GatherFor why);
  void finish_gather(GatherFor why);
  // Writes the tag of a gather for `why` at the end of the shard buffer.
  void write_tag(GatherFor why);
  // Checks the tags in `all` (every rank's shard buffer after a gather) now, or, on a device
  // and under a root, at the root's next check_device_tags; InvalidArgumentError on every rank
  // when they differ.
  void check_tags(const Tensor& all, bool now = false);
  // The same for tags already on the CPU: (world, kTagLength).
  void compare_tags(const Tensor& tags) const;
  // `all`, every rank's shard buffer in rank order, laid out parameter by parameter
  // (full_numel).
  Tensor in_parameter_order(const Tensor& all) const;
  void reshard();
  bool has_gradients() const;
  // Without sync: the members' gradients into `accumulated` (where the dtypes differ).
  void keep_unsynced_gradients();
  void reduce_gradients();
  void finish_reductions();

  Tensor pre_forward(const Tensor& input);
  Tensor post_forward(const Tensor& output);
  void pre_backward();
  void post_backward();
};

// What the units below one root share: who they are, the orders the first iteration recorded
// (for prefetching) and the end-of-backward callback.
struct Root {
  Unit* owner = nullptr;
  std::vector<std::weak_ptr<Unit>> units;  // the root first, then the module walk's order
  std::vector<std::weak_ptr<Unit>> forward_order, backward_order;
  bool forward_recorded = false, backward_recorded = false;
  size_t forward_calls = 0, backward_calls = 0;
  bool callback_queued = false;
  // Tags gathered on a device, checked together (Unit::check_tags).
  struct Tags {
    std::weak_ptr<Unit> unit;
    Tensor all;  // (world, kTagLength) on the device
  };
  std::vector<Tags> unchecked_tags;

  // The unit called after the `position`-th call (or backward) of this iteration.
  static std::shared_ptr<Unit> next(const std::vector<std::weak_ptr<Unit>>& order, bool recorded,
                                    size_t position) {
    return recorded && position + 1 < order.size() ? order[position + 1].lock() : nullptr;
  }
  // A backward that threw never ran end_of_backward: its reductions are dropped (they finish on
  // the group's thread), and the next iteration starts afresh.
  void forget_failed_backward();
  template <typename F>
  void for_each_unit(F&& f) {
    for (auto& weak : units)
      if (auto unit = weak.lock()) f(*unit);
  }
  void queue_end_of_backward();
  void end_of_backward();
  void check_device_tags();
};

// The units of `top` and its descendants (`top`'s own first), depth first in registration order:
// the same on every rank.
std::vector<std::shared_ptr<Unit>> units_below(nn::Module* top);

}  // namespace gw::fsdp::detail
