// FSDPModule's checkpoint forms: the sharded state dicts (each rank's rows, for
// gw::dist::checkpoint at any world size) and the full one (every parameter gathered).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "fsdp/fully_shard.h"
#include "fsdp/unit.h"
#include "optim/optimizer.h"

namespace gw::fsdp {

using detail::ShardedParam;
using detail::Unit;

namespace {

using ShardRef = std::pair<std::shared_ptr<Unit>, const ShardedParam*>;

// The unit among `units` and the parameter whose shard `t` is or views (state_dict() hands out
// detached views), or nulls for a tensor no unit holds.
ShardRef shard_of(const std::vector<std::shared_ptr<Unit>>& units, const Tensor& t) {
  for (const auto& unit : units)
    if (unit->shard_buffer.defined() && t.storage() == unit->shard_buffer.storage())
      for (const ShardedParam& p : unit->params)
        if (p.shard.storage_offset() == t.storage_offset() && p.shard.sizes() == t.sizes())
          return {unit, &p};
  return {nullptr, nullptr};
}

// The same for a parameter the optimizer holds: the unit that manages it, under whichever root
// (one optimizer may hold the shards of several roots: an encoder and a decoder, or a pipeline
// rank's stages), else one among `units`. Looked for only among `units`, another root's shard
// would be saved as a whole tensor of its shape, and one rank's rows kept for all.
ShardRef shard_of_param(const std::vector<std::shared_ptr<Unit>>& units, const Tensor& t) {
  if (auto holder = detail::unit_holding(t)) return shard_of({holder}, t);
  return shard_of(units, t);
}

}  // namespace

dist::checkpoint::ShardedState FSDPModule::sharded_state_dict(const std::string& prefix) const {
  namespace dcp = dist::checkpoint;
  dcp::ShardedState out;
  const auto units = detail::units_below(unit_->module);
  for (const auto& [name, t] : module_->state_dict()) {
    auto [unit, p] = shard_of(units, t);
    if (p)
      out.emplace(prefix + name, dcp::Shard{t, p->full.sizes(), p->start_of(unit->rank())});
    else
      out.emplace(prefix + name, dcp::Shard{t, t.sizes(), 0});
  }
  return out;
}

dist::checkpoint::ShardedState FSDPModule::sharded_optimizer_state(
    const optim::Optimizer& optimizer, const std::string& prefix) const {
  namespace dcp = dist::checkpoint;
  dcp::ShardedState out;
  const auto units = detail::units_below(unit_->module);
  const std::vector<Tensor>& params = optimizer.parameters();
  for (const auto& [key, t] : optimizer.state_dict()) {
    size_t i = 0;
    std::string name;
    auto [unit, p] = optim::parse_state_key(key, i, name) && i < params.size()
                         ? shard_of_param(units, params[i])
                         : ShardRef{};
    if (p && t.sizes() == p->shard.sizes())  // a moment of the shard: its rows
      out.emplace(prefix + key, dcp::Shard{t, p->full.sizes(), p->start_of(unit->rank())});
    else  // "lr", step counts: the same on every rank
      out.emplace(prefix + key, dcp::Shard{t, t.sizes(), 0});
  }
  return out;
}

void FSDPModule::load_optimizer_state(optim::Optimizer& optimizer,
                                      const dist::checkpoint::Reader& checkpoint,
                                      const std::string& prefix) const {
  // Every rank reads and checks (all the I/O, shapes, step counts), then, once all have, loads,
  // which cannot fail.
  NamedTensors state;
  optim::Optimizer::PreparedState prepared;
  const auto units = detail::units_below(unit_->module);
  unit_->on_every_rank([&] {
    const std::vector<Tensor>& params = optimizer.parameters();
    for (const auto& [full_name, info] : checkpoint.tensors()) {
      if (!full_name.starts_with(prefix)) continue;
      const std::string key = full_name.substr(prefix.size());
      size_t i = 0;
      std::string name;
      auto [unit, p] = optim::parse_state_key(key, i, name) && i < params.size()
                           ? shard_of_param(units, params[i])
                           : ShardRef{};
      if (p && name != "step") {
        // A sharded parameter's state is saved whole (sharded_optimizer_state): each rank reads
        // its rows. A tensor of another shape is another model's, or a shard saved as it was
        // (dcp::whole of a sharded optimizer's state_dict): it would fit some ranks' shards and
        // load one rank's moments into all of them. The same verdict on every rank.
        // (A 0-dim parameter's shards are 1-D: at world size 1 its moments are [1] whole.)
        const bool whole =
            info.shape == p->full.sizes() || (p->full.dim() == 0 && info.shape == Shape{1});
        GW_CHECK(whole, ShapeError, "[load_optimizer_state] ", full_name, " has shape ",
                 shape_str(info.shape), " but its parameter's whole shape is ",
                 shape_str(p->full.sizes()),
                 " (a sharded optimizer's state is saved by sharded_optimizer_state)");
        Tensor rows =
            empty(p->shard.sizes(), TensorOptions(info.dtype).with_device(p->shard.device()));
        checkpoint.read(full_name, rows, p->start_of(unit->rank()));
        state.emplace(key, rows);
      } else {
        state.emplace(key, checkpoint.read(full_name));
      }
    }
    prepared = optimizer.prepare_state_dict(state);  // checked on every rank before any loads
  });
  optimizer.take_state_dict(std::move(prepared));
}

NamedTensors FSDPModule::full_state_dict() const {
  NamedTensors out;
  autograd::NoGradGuard no_grad;
  // Unit by unit in module order, the same on every rank: the shards themselves (the master
  // weights, in their dtype under a mixed precision policy), gathered.
  std::map<const ShardedParam*, Tensor> whole;
  const auto units = detail::units_below(unit_->module);
  for (const auto& unit : units) {
    if (unit->params.empty()) continue;
    unit->drop_prefetch();
    unit->write_tag(detail::Unit::Purpose::kState);
    const Tensor mine = unit->shard_buffer.to(unit->group->device());
    Tensor all = empty({mine.numel() * unit->world()}, mine.options());
    unit->group->all_gather_into_tensor(all, mine)->wait();
    unit->compare_gathered(all);
    const Tensor flat = unit->in_parameter_order(all).to(unit->shard_buffer.device());
    for (const ShardedParam& p : unit->params)
      whole[&p] = flat.narrow(0, p.full_offset, p.full.numel()).view(p.full.sizes());
  }
  for (const auto& [name, t] : module_->state_dict()) {
    const ShardedParam* p = shard_of(units, t).second;
    out.emplace(name, p ? whole.at(p) : t.clone());
  }
  return out;
}

}  // namespace gw::fsdp
