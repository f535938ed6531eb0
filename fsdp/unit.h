// fully_shard's internal state (not installed): a unit's sharded parameters and where their
// rows live, the unit's gathering and reducing, and what the units under one root share.
// fsdp/gather.cpp and fsdp/reduce.cpp are the collectives; fsdp/fully_shard.cpp runs them around
// a module's calls and backward; fsdp/state_dict.cpp reads them for checkpoints.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
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
  bool reshard_after_backward = true;  // FSDPModule::set_reshard_after_backward
  bool all_reduce = true;              // FSDPModule::set_requires_all_reduce
  // HSDP without all_reduce: the rows and counts (chunk + params) reduce-scattered by backward
  // passes since the last sum over the replicas, added to the next one's.
  Tensor unreplicated;
  // Left gathered by a backward whose reductions every rank compared (end_of_backward), for
  // the next forward.
  bool kept = false;
  uint64_t gathering_version = 0, gathered_version = 0;  // the shards' when the gather began
  std::shared_ptr<Root> root;

  // Tags. Ranks that call units in different orders (a unit called on some ranks only, a
  // backward that failed on one rank) would pair the collectives of different units of one
  // size, and compute with another unit's parameters or average one unit's gradients with
  // another's, silently. So each rank's part of a collective carries a tag naming the unit (its
  // position under its root) and what for, as integers below 128, which every floating dtype
  // holds exactly, and every rank compares every rank's tag with its own: a gather's part ends
  // with the sender's tag (a gather copies it), and a reduction's part has a slot per rank that
  // only that rank fills (a sum of one tag and zeros). Reductions are compared everywhere, as
  // their counts are read, up to kMaxTaggedReduction ranks (the slots grow as the square of
  // the ranks); gathers on the CPU (Gloo, MPI) only, where reading them costs no wait for a
  // device. A gather started ahead is compared before this rank issues anything else (a unit
  // called out of the recorded order, a reduction, the end of backward and of the root's
  // forward), so that every rank finds a mismatch before it issues a collective that the
  // others, failed, never will.
  enum class Purpose { kForward = 1, kBackward = 2, kUnshard = 3, kState = 4, kReduction = 5 };
  static constexpr int64_t kTagLength = 8;
  static constexpr int kMaxTaggedReduction = 64;

  // Gathering: the all-gather in flight and the buffer it fills (every rank's shard buffer in
  // rank order), then `gathered` once the members view their rows.
  dist::WorkPtr gather_work;
  Tensor gathering;
  bool gathered = false;

  // Reduce-scatters issued by this backward, written into the shards' .grad at its end. Each
  // rank's part of a reduction carries, after the gradients, one count per parameter (how many
  // ranks had a gradient for it, so that a parameter no rank used keeps no .grad, as it would
  // without sharding), then the ranks' tag slots (tagged_reduction()).
  struct Reduction {
    Tensor output;  // (reduction_stride()): this rank's summed rows, the counts, the tags
    dist::WorkPtr work;
    std::vector<double> counts;  // and the tags, once waited for and compared
  };
  std::vector<Reduction> reductions;
  bool reduced = false;  // this backward reduced it at least once

  int world() const { return group->size(); }
  int rank() const { return group->rank(); }
  int replicas() const { return options.replicate_group ? options.replicate_group->size() : 1; }
  // HSDP without all_reduce: this backward's reduced rows stay in the replica (`unreplicated`).
  bool keeps_in_replica() const { return !all_reduce && replicas() > 1; }
  // dist::checkpoint::on_every_rank over every rank that holds this unit: its shard group, and
  // under HSDP the replicas too (each shard group's verdict then goes over the replicate group).
  void on_every_rank(const std::function<void()>& f) const;
  bool is_root() const;

  // The shards in compute_dtype where the collectives run: copied from host memory first when
  // they are offloaded, then converted on the device.
  Tensor on_group_device(const Tensor& shards) const {
    return shards.to(group->device()).to(compute_dtype);
  }
  std::vector<double> tag(Purpose why) const;
  bool checks_gathers() const { return group->device().is_cpu() && world() > 1; }
  // Writes the tag of a gather for `why` at the end of the shard buffer (where checked).
  void write_tag(Purpose why);
  // Every rank's tag, `tags` (world x kTagLength) from a gather or a reduction, against this
  // rank's: InvalidArgumentError naming both units where they differ (the same on every rank,
  // which all read the same tags), after forgetting the recorded call orders.
  void compare_tags(const std::vector<double>& tags, const char* verb) const;
  // The same for `all`, every rank's shard buffer after a gather (where checked).
  void compare_gathered(const Tensor& all) const;
  void start_gather(Purpose why);
  void finish_gather(Purpose why);
  // A gather started ahead (a prefetch) that will not be used: waited for, and its tags
  // compared.
  void drop_prefetch();
  // One that may still be used: waited for and compared, and kept.
  void check_prefetch();
  // `all`, every rank's shard buffer in rank order, laid out parameter by parameter
  // (full_numel).
  Tensor in_parameter_order(const Tensor& all) const;
  void reshard();
  // Gathered from shards that have changed since (an optimizer step, a load) or moved: what a
  // unit kept gathered after backward (reshard_after_backward false) must be gathered again.
  bool gathered_stale() const {
    if (!gathered || params.empty()) return false;
    if (shard_buffer.storage()->version() != gathered_version) return true;
    return std::any_of(params.begin(), params.end(), [&](const ShardedParam& p) {
      return p.shard.storage() != shard_buffer.storage();
    });
  }
  // Freezing or unfreezing through either handle (the shard or the member): the other follows.
  void sync_requires_grad();
  bool has_gradients() const;
  bool tagged_reduction() const { return world() <= kMaxTaggedReduction; }
  int64_t reduction_stride() const {
    return chunk + static_cast<int64_t>(params.size()) +
           (tagged_reduction() ? world() * kTagLength : 0);
  }
  // Waits for this backward's reductions and compares their tags, applying nothing; with
  // replicas, sums them over the replicas (sum_over_replicas).
  void check_reductions();
  void sum_over_replicas(bool failed);
  // Without sync: the members' gradients into `accumulated` (where the dtypes differ).
  void keep_unsynced_gradients();
  void reduce_gradients();
  void finish_reductions();

  // Whether this call runs inside a backward pass (autograd::checkpoint recomputing it).
  bool recomputing() const;
  Tensor pre_forward(const Tensor& input);
  Tensor post_forward(const Tensor& output);
  void pre_backward();
  void post_backward();
  // This unit's call number `calls` (counted up) of this pass in `order` (recorded there in the
  // first iteration): the gathers started ahead that another unit's call makes useless dropped,
  // its own finished, and the next unit's in the recorded order started.
  void gather_in_order(std::vector<std::weak_ptr<Unit>>& order, bool recorded, size_t& calls,
                       Purpose why);
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
  // Before unit `u` runs at `position` of a recorded order: where the order named another unit,
  // the gathers started ahead for it are waited for and compared (the ranks may have started
  // different ones), so that no rank is left waiting in a gather the others never start.
  void settle_prefetches(const std::vector<std::weak_ptr<Unit>>& order, bool recorded,
                         size_t position, const Unit& u);
  // After ranks were found calling units in different orders: record them afresh.
  void forget_orders();
};

// The units of `top` and its descendants (`top`'s own first), depth first in registration order:
// the same on every rank.
std::vector<std::shared_ptr<Unit>> units_below(nn::Module* top);

// The unit, under any root, that manages tensor `t` (a parameter as a whole or its shard), or
// null.
std::shared_ptr<Unit> unit_holding(const Tensor& t);

}  // namespace gw::fsdp::detail
