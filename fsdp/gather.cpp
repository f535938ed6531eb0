// fully_shard's collectives, gathering: a unit's shards all-gathered into one flat buffer that
// its members view, each rank's part tagged with the unit and what for (fsdp/unit.h's Tags),
// and released again.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "core/ops.h"
#include "fsdp/unit.h"

namespace gw::fsdp::detail {

namespace {
// Releases a member's hold on the gathered buffer it views.
void release_storage(void* ctx, void*) { delete static_cast<std::shared_ptr<Storage>*>(ctx); }
}  // namespace

// --- gathering --------------------------------------------------------------------------------

std::vector<double> Unit::tag(Purpose why) const {
  std::vector<double> t(kTagLength, 0.0);
  t[0] = static_cast<double>(position & 127);
  t[1] = static_cast<double>((position >> 7) & 127);
  t[2] = static_cast<double>((position >> 14) & 127);
  t[3] = static_cast<double>(why);
  // Gradients kept in the replica (set_requires_all_reduce(false)): every rank of the shard
  // group and every replica must keep them alike.
  t[4] = why == Purpose::kReduction && keeps_in_replica() ? 1.0 : 0.0;
  return t;
}

void Unit::write_tag(Purpose why) {
  if (!checks_gathers()) return;
  // Through the backend, not copy_: the shards share the buffer's version counter, and autograd
  // would take the shards (saved by an op that read them) for modified.
  const Tensor t = from_vector<double>(tag(why)).to(shard_buffer.dtype());
  const Tensor dst = shard_buffer.narrow(0, chunk, kTagLength);
  backend_for(dst.device().type, "fully_shard").copy(t, dst);
}

void Unit::compare_tags(const std::vector<double>& tags, const char* verb) const {
  const auto mine = tags.begin() + rank() * kTagLength;
  auto describe = [&](int r) {
    const double* t = tags.data() + r * kTagLength;
    for (int64_t i = 0; i < 4; ++i)
      if (!(t[i] >= 0 && t[i] < 128 && t[i] == std::floor(t[i])))
        return std::string("something else");
    const auto at = static_cast<size_t>(t[0]) | static_cast<size_t>(t[1]) << 7 |
                    static_cast<size_t>(t[2]) << 14;
    std::shared_ptr<Unit> unit = root && at < root->units.size() ? root->units[at].lock() : nullptr;
    const char* what[] = {"?",         "its forward",       "its backward",
                          "unshard()", "a full state dict", "its gradients"};
    const auto why = static_cast<size_t>(t[3]);
    return gw::detail::str(
        "unit ", at, " (", unit ? unit->type_name : "?", ") for ",
        what[why < std::size(what) ? why : 0],
        t[4] == 1 ? ", kept in its replica (set_requires_all_reduce(false))" : "");
  };
  for (int r = 0; r < world(); ++r) {
    if (std::equal(mine, mine + kTagLength, tags.begin() + r * kTagLength)) continue;
    if (root) root->forget_orders();
    throw InvalidArgumentError(gw::detail::str(
        "[fully_shard] rank ", rank(), " ", verb, " ", describe(rank()), " while rank ", r, " ",
        verb, " ", describe(r),
        ": every rank must call the same units in the same order (a unit called on some ranks "
        "only, or a backward that failed on some ranks, pairs the collectives of different "
        "units)"));
  }
}

void Unit::compare_gathered(const Tensor& all) const {
  if (checks_gathers())
    compare_tags(all.view({world(), -1}).narrow(1, chunk, kTagLength).to_vector<double>(),
                 "gathered");
}

void Unit::check_prefetch() {
  if (!gather_work || !checks_gathers()) return;
  gather_work->wait();
  try {
    compare_gathered(gathering);
  } catch (...) {  // not compared (and thrown) again at the next reshard
    gather_work = nullptr;
    gathering = Tensor();
    throw;
  }
}

void Unit::drop_prefetch() {
  if (!gather_work) return;
  std::exchange(gather_work, nullptr)->wait();
  compare_gathered(std::exchange(gathering, Tensor()));
}

void Unit::start_gather(Purpose why) {
  // Kept from a backward, from shards that have changed since (or moved: refused below). A
  // unit gathered in this pass keeps what its forward computed with.
  if (kept && gathered_stale()) reshard();
  if (gathered || gather_work) return;
  if (params.empty()) {  // a container of units: nothing to gather (the same on every rank)
    gathered = true;
    return;
  }
  for (const ShardedParam& p : params)
    GW_CHECK(p.shard.storage() == shard_buffer.storage(), StateError, "[fully_shard] ", p.name,
             "'s shard was moved or converted (Module::to?) after fully_shard: shard the module "
             "on its device and in its dtype");
  write_tag(why);
  gathering_version = shard_buffer.storage()->version();
  const Tensor mine = on_group_device(shard_buffer);
  gathering = empty({mine.numel() * world()}, mine.options());
  gather_work = group->all_gather_into_tensor(gathering, mine);
}

void Unit::finish_gather(Purpose why) {
  start_gather(why);
  if (gathered) return;
  dist::WorkPtr work = std::exchange(gather_work, nullptr);
  Tensor all = std::exchange(gathering, Tensor());
  work->wait();
  compare_gathered(all);
  const Tensor flat = in_parameter_order(all);
  const size_t item = itemsize(compute_dtype);
  auto* to = static_cast<uint8_t*>(flat.raw_data());
  for (ShardedParam& p : params) {
    const size_t nbytes = p.full.nbytes();
    p.full.storage()->reset(to + p.full_offset * item, nbytes,
                            {&release_storage, new std::shared_ptr<Storage>(flat.storage())});
  }
  sync_requires_grad();
  gathered = true;
  gathered_version = gathering_version;
}

void Unit::sync_requires_grad() {
  // Frozen or unfrozen after fully_shard through either handle (PyTorch's FSDP2 has one and
  // reads it at every gather), the other follows: whichever changed since the last look. A
  // backward already recorded still gives the parameter its gradient, as without sharding (the
  // next forward is the first that leaves it out).
  for (ShardedParam& p : params) {
    if (p.full.requires_grad() != p.requires_grad)
      p.shard.requires_grad_(p.full.requires_grad());
    else if (p.shard.requires_grad() != p.requires_grad)
      p.full.requires_grad_(p.shard.requires_grad());
    p.requires_grad = p.shard.requires_grad();
  }
}

Tensor Unit::in_parameter_order(const Tensor& all) const {
  // Each parameter's rows come from every rank's chunk.
  Tensor flat = world() == 1 ? all : empty({full_numel}, all.options());
  const int64_t stride = all.numel() / world();  // a rank's shard buffer
  const size_t item = all.element_size();
  if (world() > 1)
    for (const ShardedParam& p : params)
      for (int r = 0; r < world(); ++r) {
        const int64_t count = p.rows_of(r) * p.row_numel;
        if (count == 0) continue;
        if (flat.device().is_cpu())
          std::memcpy(
              static_cast<uint8_t*>(flat.raw_data()) + (p.full_offset + p.start_of(r)) * item,
              static_cast<const uint8_t*>(all.raw_data()) + (r * stride + p.offset) * item,
              static_cast<size_t>(count) * item);
        else  // on the device's stream
          flat.narrow(0, p.full_offset + p.start_of(r), count)
              .copy_(all.narrow(0, r * stride + p.offset, count));
      }
  return flat;
}

void Unit::reshard() {
  drop_prefetch();  // one nobody used: it still has to finish on every rank
  kept = false;
  if (!gathered) return;
  for (const ShardedParam& p : params) p.full.storage()->reset(nullptr, 0, {});
  gathered = false;
}

}  // namespace gw::fsdp::detail
