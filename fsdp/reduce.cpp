// fully_shard's collectives, reducing: a unit's gradients reduce-scattered into its shards (with
// the counts that say which parameters had gradients, and every rank's tag), under HSDP summed
// over the replicas too, and averaged into the shards' .grad at the end of backward; without
// sync, kept for the next backward instead (whole); under HSDP without all_reduce, the
// reduce-scattered sums kept for the next sum over the replicas.
#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "fsdp/unit.h"

namespace gw::fsdp::detail {

// --- reducing ---------------------------------------------------------------------------------

bool Unit::has_gradients() const {
  return std::any_of(params.begin(), params.end(),
                     [](const ShardedParam& p) { return p.full.grad().defined(); });
}

void Unit::keep_unsynced_gradients() {
  if (reduce_dtype == compute_dtype) return;  // autograd adds the members' .grad as it should
  for (ShardedParam& p : params) {
    const Tensor grad = p.full.grad();
    if (!grad.defined()) continue;
    p.full.set_grad(Tensor());
    if (p.accumulated.defined())
      p.accumulated.add_(grad.to(reduce_dtype));
    else
      p.accumulated = grad.to(reduce_dtype);
  }
}

void Unit::reduce_gradients() {
  reduced = true;
  if (!sync) keep_unsynced_gradients();
  if (!sync || params.empty()) return;
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t stride = reduction_stride();  // gradients, counts, tag slots
  Tensor input =
      zeros({stride * world()}, TensorOptions(reduce_dtype).with_device(group->device()));
  if (tagged_reduction()) {  // this rank's tag, in its slot of every rank's part
    const Tensor mine =
        from_vector<double>(tag(Purpose::kReduction)).to(reduce_dtype).to(group->device());
    input.view({world(), stride})
        .narrow(1, chunk + n + rank() * kTagLength, kTagLength)
        .copy_(mine);
  }
  for (int64_t i = 0; i < n; ++i) {
    ShardedParam& p = params[static_cast<size_t>(i)];
    Tensor grad = p.full.grad();
    if (Tensor sum = std::exchange(p.accumulated, Tensor()); sum.defined())
      grad = grad.defined() ? sum.add_(grad.to(reduce_dtype)) : sum;
    if (!grad.defined()) continue;
    grad = grad.contiguous().reshape({-1});
    for (int r = 0; r < world(); ++r) {
      const int64_t count = p.rows_of(r) * p.row_numel;
      if (count > 0)
        input.narrow(0, r * stride + p.offset, count).copy_(grad.narrow(0, p.start_of(r), count));
      input.narrow(0, r * stride + chunk + i, 1).fill_(1);
    }
    p.full.set_grad(Tensor());
  }
  Tensor output = empty({stride}, input.options());
  // A gather started ahead is compared before the reduction goes out behind it.
  if (root) root->for_each_unit([](Unit& u) { u.check_prefetch(); });
  reductions.push_back({output, group->reduce_scatter_tensor(output, input), {}});
}

void Unit::check_reductions() {
  const auto n = static_cast<int64_t>(params.size());
  bool fresh = false;
  std::exception_ptr failed;  // this shard group's ranks disagree
  for (Reduction& red : reductions) {
    if (!red.counts.empty()) continue;
    red.work->wait();
    fresh = true;
    if (!tagged_reduction() || failed) continue;
    try {
      compare_tags(red.output.narrow(0, chunk + n, world() * kTagLength).to_vector<double>(),
                   "reduced");
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (!fresh) return;
  // The replicas learn of it too, and fail here with this group rather than wait for it.
  if (replicas() > 1) sum_over_replicas(failed != nullptr);
  if (failed) std::rethrow_exception(failed);
  for (Reduction& red : reductions)
    if (red.counts.empty()) red.counts = red.output.narrow(0, chunk, n).to_vector<double>();
}

// HSDP: each new reduction's sums in this shard group (its rows and counts) summed over the
// replicas, in place, with what earlier backward passes without all_reduce kept. First the
// replicas compare what must be the same on all of them: the unit's tag, its count of
// reductions, this rank's place in its shard group and the group's size (a replicate group
// pairing other places would sum other rows), whether they sum now (all_reduce, in the tag),
// and whether its shard group failed (`failed`: then nothing is summed, and the caller throws what
// it found). They sum the values and their squares, which come to replicas x this rank's values and
// their squares only where every replica's are this rank's (Cauchy-Schwarz).
void Unit::sum_over_replicas(bool failed) {
  dist::ProcessGroup& replicas_group = *options.replicate_group;
  std::vector<double> mine = tag(Purpose::kReduction);
  for (double x : {static_cast<double>(reductions.size()), static_cast<double>(rank()),
                   static_cast<double>(world()), failed ? 1.0 : 0.0})
    mine.push_back(x);
  std::vector<double> both = mine;
  for (double x : mine) both.push_back(x * x);
  Tensor sums = from_vector<double>(both).to(replicas_group.device());
  replicas_group.allreduce(sums)->wait();
  const std::vector<double> got = sums.to_vector<double>();
  const auto r = static_cast<double>(replicas());
  bool agree = true;
  for (size_t i = 0; i < mine.size(); ++i)
    agree = agree && got[i] == r * mine[i] && got[mine.size() + i] == r * mine[i] * mine[i];
  if (failed) return;
  if (!agree) {
    if (root) root->forget_orders();
    throw InvalidArgumentError(gw::detail::str(
        "[fully_shard] rank ", rank(), " of ", world(), " in replica ", replicas_group.rank(),
        " reduced ", type_name, " (unit ", position, ") ", reductions.size(),
        " time(s) in this backward, and another replica did otherwise (another unit or count, "
        "another place in its shard group, set_requires_all_reduce otherwise, or its ranks "
        "disagreed): every replica must call the same units in the same order and set alike, "
        "and the replicate group pair the same places"));
  }
  if (keeps_in_replica()) return;  // finish_reductions keeps them in `unreplicated`
  for (Reduction& red : reductions) {
    if (!red.counts.empty()) continue;  // summed by an earlier call
    Tensor sums_and_counts = red.output.narrow(0, 0, chunk + static_cast<int64_t>(params.size()));
    if (unreplicated.defined()) sums_and_counts.add_(std::exchange(unreplicated, Tensor()));
    replicas_group.allreduce(sums_and_counts)->wait();
  }
}

void Unit::finish_reductions() {
  check_reductions();
  if (keeps_in_replica()) {  // no .grad yet: kept for the next sum over the replicas
    for (Reduction& red : reductions) {
      const Tensor sums_and_counts =
          red.output.narrow(0, 0, chunk + static_cast<int64_t>(params.size()));
      if (unreplicated.defined())
        unreplicated.add_(sums_and_counts);
      else
        unreplicated = sums_and_counts.clone();
    }
    reductions.clear();
    return;
  }
  for (Reduction& red : reductions) {
    const std::vector<double>& counts = red.counts;
    // The average, in place: each shard's .grad views the buffer (no second copy of them), in
    // the shards' dtype.
    Tensor summed = red.output.narrow(0, 0, chunk)
                        .div_(static_cast<double>(world()) * replicas())
                        .to(dtype)
                        .to(shard_buffer.device());
    for (size_t i = 0; i < params.size(); ++i) {
      if (counts[i] == 0) continue;  // no rank had a gradient for it
      ShardedParam& p = params[i];
      Tensor grad = summed.narrow(0, p.offset, p.shard.numel()).view(p.shard.sizes());
      if (Tensor old = p.shard.grad(); old.defined())
        old.add_(grad);
      else
        p.shard.set_grad(grad);
    }
  }
  reductions.clear();
}

}  // namespace gw::fsdp::detail
