// fully_shard: a module made a unit (its parameters cut into shards), its parameters gathered
// around its calls and its backward, its gradients reduce-scattered into the shards after it;
// clip_grad_norm_ over shards. The units' state is fsdp/unit.h, their collectives
// fsdp/gather.cpp and fsdp/reduce.cpp, their checkpoint forms fsdp/state_dict.cpp.
#include "fsdp/fully_shard.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "autograd/autograd.h"
#include "core/memory.h"
#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "fsdp/unit.h"

namespace gw::fsdp {

namespace detail {

bool Unit::is_root() const { return root && root->owner == this; }

namespace {

// Which modules are units and which tensors they manage (by identity). An entry whose unit is
// gone no longer counts.
struct Registry {
  std::mutex mu;
  std::unordered_map<const nn::Module*, std::weak_ptr<Unit>> modules;
  std::unordered_map<const TensorImpl*, std::weak_ptr<Unit>> tensors;

  static Registry& get() {
    static Registry registry;
    return registry;
  }
  std::shared_ptr<Unit> unit_of(const nn::Module* m) {
    std::lock_guard lock(mu);
    auto it = modules.find(m);
    return it == modules.end() ? nullptr : it->second.lock();
  }
  std::shared_ptr<Unit> holder_of(const Tensor& t) {
    std::lock_guard lock(mu);
    auto it = tensors.find(t.impl());
    return it == tensors.end() ? nullptr : it->second.lock();
  }
};

// The gradient of a unit's input passes through this node: when it runs, the unit's backward
// has ended (every node that fed the unit's input has run, and AccumulateGrad runs as soon as
// it is ready), so the unit's gradients can be reduced.
class PostBackward final : public autograd::Node {
 public:
  explicit PostBackward(std::weak_ptr<Unit> unit) : unit_(std::move(unit)) {}
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    if (auto unit = unit_.lock()) unit->post_backward();
    return std::move(grads);
  }
  std::string name() const override { return "fsdp::PostBackward"; }
  // It reduce-scatters the unit's gradients: a backward_input (zero bubble's I) would leave
  // them for after it, unreduced.
  bool needs_weight_gradients() const override { return true; }

 private:
  std::weak_ptr<Unit> unit_;
};

}  // namespace

std::shared_ptr<Unit> unit_holding(const Tensor& t) { return Registry::get().holder_of(t); }

std::vector<std::shared_ptr<Unit>> units_below(nn::Module* top) {
  std::vector<std::shared_ptr<Unit>> units;
  std::vector<nn::Module*> stack{top};
  while (!stack.empty()) {
    nn::Module* m = stack.back();
    stack.pop_back();
    if (auto unit = Registry::get().unit_of(m)) units.push_back(std::move(unit));
    const auto& children = m->named_children();
    for (auto it = children.rbegin(); it != children.rend(); ++it)
      stack.push_back(it->second.get());
  }
  return units;
}

// --- the hooks --------------------------------------------------------------------------------

void Unit::on_every_rank(const std::function<void()>& f) const {
  if (!options.replicate_group) return dist::checkpoint::on_every_rank(*group, f);
  dist::checkpoint::on_every_rank(*options.replicate_group,
                                  [&] { dist::checkpoint::on_every_rank(*group, f); });
}

bool Unit::recomputing() const {
  return root != nullptr && grad_mode_enabled() && autograd::in_backward_pass();
}

Tensor Unit::pre_forward(const Tensor& input) {
  if (!root) {  // the first call below no root: this unit is the root of what it holds
    auto r = std::make_shared<Root>();
    r->owner = this;
    for (auto& unit : units_below(module)) {
      unit->root = r;
      unit->position = r->units.size();
      r->units.push_back(unit);
    }
  }
  if (recomputing()) {
    // An activation checkpoint runs this unit again inside the backward pass, for its backward
    // (its first call, without grad, freed the parameters after it): gathered as for the
    // unit's backward, in the backward's order; the forward's order is not this call's.
    pre_backward();
  } else {
    if (is_root()) {
      root->forget_failed_backward();
      // Nothing stays gathered from an earlier call (a forward whose backward never ran, an
      // unused prefetch), but what a unit keeps after backward (set_reshard_after_backward)
      // from shards that have not changed since (no optimizer step, no load in between).
      root->for_each_unit([](Unit& u) {
        if (!u.kept || u.reshard_after_backward || u.gathered_stale())
          u.reshard();
        else
          u.sync_requires_grad();
      });
      root->forward_calls = 0;
      if (!root->forward_recorded) root->forward_order.clear();  // a first forward that threw
    }
    gather_in_order(root->forward_order, root->forward_recorded, root->forward_calls,
                    Purpose::kForward);
  }
  Tensor x = input;
  // Each unit casts its floating input to its policy's param_dtype, as FSDP2 does.
  const auto& mp = options.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype && x.is_floating_point())
    x = x.to(*mp.param_dtype);  // itself when it is that dtype already
  if (!grad_mode_enabled() || !x.requires_grad()) return x.same(input) ? Tensor() : x;
  // The input's gradient passes through PostBackward on its way out of the unit.
  auto node = std::make_shared<PostBackward>(weak_from_this());
  node->next_edges = autograd::collect_edges({&x});
  Tensor passed = x.detach();
  autograd::set_history(passed, node);
  return passed;
}

Tensor Unit::post_forward(const Tensor& output) {
  // A recomputation (pre_forward) keeps the parameters for the backward that follows it, whose
  // start pre_forward was; the end of the pass frees them if that backward never comes.
  const bool recompute = recomputing();
  const bool backward_follows = grad_mode_enabled() && output.requires_grad() && !recompute;
  if (is_root() && !recompute) {
    root->forward_recorded = true;
    root->for_each_unit([](Unit& u) { u.drop_prefetch(); });  // none is used now
  }
  if (!recompute && (!backward_follows || (options.reshard_after_forward && !is_root()))) reshard();
  // The policy's output_dtype: a cast after the unit, whose backward casts the gradient back
  // before it reaches the unit's output (and its hook below).
  const std::optional<DType> cast = options.mp_policy.output_dtype;
  Tensor out =
      cast && output.is_floating_point() && output.dtype() != *cast ? output.to(*cast) : Tensor();
  if (!backward_follows) return out;
  autograd::Edge edge = autograd::gradient_edge(output);
  if (edge.valid())
    edge.fn->pre_hooks.emplace_back(edge.input_nr, [weak = weak_from_this()](const Tensor&) {
      if (auto unit = weak.lock()) unit->pre_backward();
      return Tensor();
    });
  return out;
}

void Unit::pre_backward() {
  root->queue_end_of_backward();
  gather_in_order(root->backward_order, root->backward_recorded, root->backward_calls,
                  Purpose::kBackward);
}

void Unit::gather_in_order(std::vector<std::weak_ptr<Unit>>& order, bool recorded, size_t& calls,
                           Purpose why) {
  const size_t position = calls++;
  if (!recorded) order.push_back(weak_from_this());
  root->settle_prefetches(order, recorded, position, *this);
  finish_gather(why);
  if (auto next = Root::next(order, recorded, position)) next->start_gather(why);
}

void Unit::post_backward() {
  root->queue_end_of_backward();
  reduce_gradients();
  if (reshard_after_backward) reshard();
}

void Root::queue_end_of_backward() {
  if (callback_queued) return;
  autograd::queue_callback([this] { end_of_backward(); });
  callback_queued = true;
}

void Root::settle_prefetches(const std::vector<std::weak_ptr<Unit>>& order, bool recorded,
                             size_t position, const Unit& u) {
  if (!recorded || (position < order.size() && order[position].lock().get() == &u)) return;
  for_each_unit([&](Unit& other) {
    if (&other != &u) other.drop_prefetch();
  });
}

void Root::forget_orders() {
  forward_recorded = backward_recorded = false;
  forward_order.clear();
  backward_order.clear();
}

void Root::forget_failed_backward() {
  if (!callback_queued) return;
  callback_queued = false;
  backward_calls = 0;
  if (!backward_recorded) backward_order.clear();
  for_each_unit([](Unit& u) {
    u.reductions.clear();
    u.reduced = false;
    // What the failed pass left on the members (and what accumulated without sync, or without
    // the sum over the replicas, before it) would otherwise be added into the next step.
    u.unreplicated = Tensor();
    for (ShardedParam& p : u.params) {
      p.full.set_grad(Tensor());
      p.accumulated = Tensor();
    }
  });
}

// Every unit takes part in a reduction, in the same order on every rank: those whose backward
// did not end through their input (the root, whose input is tokens; a unit no rank's loss
// reached) and those that got gradients after they were reduced.
void Root::end_of_backward() {
  for_each_unit([](Unit& u) { u.drop_prefetch(); });  // none is used now
  for_each_unit([](Unit& u) {
    if (!u.sync)
      u.keep_unsynced_gradients();
    else if (!u.reduced || u.has_gradients())
      u.reduce_gradients();
  });
  // Every reduction compared before any reaches a .grad: a mismatch leaves the shards' .grad
  // as it was on every rank.
  for_each_unit([](Unit& u) { u.check_reductions(); });
  // Every rank's pass compared: what stays gathered for the next forward is decided alike on
  // every rank from here, even where a rank fails below (its failed pass forgotten, what it
  // keeps is the others').
  for_each_unit([](Unit& u) { u.kept = !u.reshard_after_backward && u.gathered; });
  for_each_unit([](Unit& u) {
    u.finish_reductions();
    if (u.reshard_after_backward) u.reshard();
    u.reduced = false;
  });
  // Only now: when the above throws, the next call forgets this pass (forget_failed_backward).
  callback_queued = false;
  backward_recorded = true;
  backward_calls = 0;
}

}  // namespace detail

using detail::Registry;
using detail::ShardedParam;
using detail::Unit;

namespace {

// The parameters `unit` manages: those of its module and of descendants that are not units,
// each once however many modules register it.
void collect_params(Unit& unit, nn::Module& top) {
  std::unordered_map<const TensorImpl*, size_t> index;
  std::vector<std::pair<std::string, nn::Module*>> stack{{"", &top}};
  while (!stack.empty()) {
    auto [prefix, m] = stack.back();
    stack.pop_back();
    for (const auto& [name, t] : m->named_parameters(false)) {
      auto [it, fresh] = index.emplace(t.impl(), unit.params.size());
      if (fresh) {
        if (auto other = Registry::get().holder_of(t))
          throw InvalidArgumentError(gw::detail::str(
              "[fully_shard] ", unit.type_name, "'s parameter ", prefix + name,
              " belongs to another unit (", other->type_name,
              "): a parameter shared by two "
              "units cannot be sharded by both; shard the module that holds both uses, and the "
              "blocks before the root"));
        ShardedParam p;
        p.name = prefix + name;
        p.full = t;
        unit.params.push_back(std::move(p));
      }
      unit.params[it->second].owners.emplace_back(m, name);
    }
    const auto& children = m->named_children();
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      if (Registry::get().unit_of(it->second.get())) continue;  // its own unit
      stack.emplace_back(prefix + it->first + ".", it->second.get());
    }
  }
}

}  // namespace

std::shared_ptr<FSDPModule> fully_shard(const std::shared_ptr<nn::Module>& module,
                                        std::shared_ptr<dist::ProcessGroup> group,
                                        FullyShardOptions options) {
  GW_CHECK(group != nullptr, InvalidArgumentError, "[fully_shard] the process group is null");
  auto unit = std::make_shared<Unit>();
  unit->group = std::move(group);
  unit->module = module.get();
  unit->options = options;
  // What one rank alone can find wrong (a module sharded already, a parameter another unit
  // holds, a device or dtype that does not fit) fails every rank at once, naming that rank,
  // rather than leaving the others in the next collective until its timeout.
  unit->on_every_rank([&] {
    GW_CHECK(module != nullptr, InvalidArgumentError, "[fully_shard] the module is null");
    unit->type_name = module->type_name();
    GW_CHECK(!Registry::get().unit_of(module.get()), InvalidArgumentError, "[fully_shard] this ",
             module->type_name(), " is sharded already");
    collect_params(*unit, *module);
    for (const ShardedParam& p : unit->params) {
      GW_CHECK(p.full.device() == unit->group->device(), InvalidArgumentError, "[fully_shard] ",
               p.name, " is on ", p.full.device().str(), "; the ", unit->group->backend(),
               " group takes tensors on ", unit->group->device().str());
      GW_CHECK(p.full.dtype() == unit->params[0].full.dtype(), InvalidArgumentError,
               "[fully_shard] a unit's parameters share one flat buffer, so one dtype: ", p.name,
               " is ", p.full.dtype(), ", ", unit->params[0].name, " ",
               unit->params[0].full.dtype());
    }
    if (!unit->params.empty()) unit->dtype = unit->params[0].full.dtype();
    const MixedPrecisionPolicy& mp = options.mp_policy;
    unit->compute_dtype = mp.param_dtype.value_or(unit->dtype);
    unit->reduce_dtype = mp.reduce_dtype.value_or(unit->compute_dtype);
    for (DType d : {unit->compute_dtype, unit->reduce_dtype})
      GW_CHECK(is_floating(d), InvalidArgumentError,
               "[fully_shard] the mixed precision policy's dtypes must be floating point, got ", d);
    if (const auto& replicas = options.replicate_group)
      GW_CHECK(replicas->device() == unit->group->device(), InvalidArgumentError,
               "[fully_shard] the replicate group's tensors are on ", replicas->device().str(),
               ", the shard group's on ", unit->group->device().str(), ": they must be one device");
  });

  // Every rank must hold the same parameters: checked on every rank before anything changes.
  std::vector<Tensor> fulls;
  std::vector<std::string> names;
  for (const ShardedParam& p : unit->params) {
    fulls.push_back(p.full);
    names.push_back(p.name);
  }
  unit->group->check_same_shapes(fulls, names, "fully_shard");
  if (const auto& replicas = options.replicate_group)
    replicas->check_same_shapes(fulls, names, "fully_shard");

  // The layout: each parameter's rows, padded to the same count on every rank.
  const int world = unit->world();
  for (ShardedParam& p : unit->params) {
    p.rows = p.full.dim() == 0 ? 1 : p.full.size(0);
    p.row_numel = p.full.dim() == 0 ? 1 : p.full.numel() / std::max<int64_t>(p.rows, 1);
    p.rows_per_rank = (p.rows + world - 1) / world;
    p.offset = unit->chunk;
    p.full_offset = unit->full_numel;
    unit->chunk += p.rows_per_rank * p.row_numel;
    unit->full_numel += p.full.numel();
  }
  const auto& offload = options.offload_policy;
  const Device device = unit->group->device();
  unit->shard_buffer = zeros({unit->chunk + Unit::kTagLength},
                             TensorOptions(unit->dtype).with_device(offload ? kCPU : device));
  if (offload && offload->pin_memory && !device.is_cpu())
    unit->shard_buffer = pin_memory(unit->shard_buffer);

  // Keep this rank's rows, make them the module's parameters, and release the whole ones.
  autograd::NoGradGuard no_grad;
  const int rank = unit->rank();
  for (ShardedParam& p : unit->params) {
    const int64_t count = p.rows_of(rank) * p.row_numel;
    Tensor mine = unit->shard_buffer.narrow(0, p.offset, count);
    mine.copy_(p.full.contiguous().reshape({-1}).narrow(0, p.start_of(rank), count));
    Shape shape = p.full.sizes();
    if (shape.empty())
      shape = {p.rows_of(rank)};
    else
      shape[0] = p.rows_of(rank);
    p.shard = mine.view(shape).detach();
    p.shard.requires_grad_(p.full.requires_grad());
    p.requires_grad = p.full.requires_grad();
    for (auto& [owner, name] : p.owners) owner->swap_parameter(name, p.shard);
    // Its own block (so that releasing it touches nothing else), released until gathered.
    p.full.set_grad(Tensor());
    p.full.set_data(empty(p.full.sizes(), p.full.options().with_dtype(unit->compute_dtype)));
    p.full.storage()->reset(nullptr, 0, {});
  }

  {
    Registry& registry = Registry::get();
    std::lock_guard lock(registry.mu);
    std::erase_if(registry.modules, [](const auto& e) { return e.second.expired(); });
    std::erase_if(registry.tensors, [](const auto& e) { return e.second.expired(); });
    registry.modules[module.get()] = unit;
    for (const ShardedParam& p : unit->params) {
      registry.tensors[p.full.impl()] = unit;
      registry.tensors[p.shard.impl()] = unit;  // a unit made below this one later is refused
    }
  }
  // The module's hooks own the unit.
  module->register_forward_pre_hook(
      [unit](nn::Module&, const Tensor& input) { return unit->pre_forward(input); });
  module->register_forward_hook([unit](nn::Module&, const Tensor&, const Tensor& output) {
    return unit->post_forward(output);
  });
  return std::make_shared<FSDPModule>(unit, module);
}

std::shared_ptr<FSDPModule> fully_shard(const std::shared_ptr<nn::Module>& module,
                                        const dist::DeviceMesh& mesh, FullyShardOptions options) {
  const auto& names = mesh.names();
  GW_CHECK(names.size() == 1 || names.size() == 2, InvalidArgumentError,
           "[fully_shard] takes a 1-D mesh (shard) or a 2-D one (replicate, shard), got ",
           names.size(), " dimensions");
  GW_CHECK(names.size() == 1 || !options.replicate_group, InvalidArgumentError,
           "[fully_shard] a 2-D mesh names the replicate group: drop options.replicate_group");
  if (names.size() == 2) options.replicate_group = mesh.group(names[0]);
  return fully_shard(module, mesh.group(names.back()), std::move(options));
}

double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm,
                       dist::ProcessGroup& group) {
  return clip_grad_norm_(shards, max_norm, std::vector<dist::ProcessGroup*>{&group});
}

double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm,
                       const std::vector<dist::ProcessGroup*>& groups) {
  GW_CHECK(!groups.empty(), InvalidArgumentError, "[fsdp::clip_grad_norm_] no group given");
  for (const dist::ProcessGroup* g : groups)
    GW_CHECK(g->device() == groups[0]->device(), InvalidArgumentError,
             "[fsdp::clip_grad_norm_] the groups reduce on ", groups[0]->device().str(), " and ",
             g->device().str(), ": give groups of one device");
  GW_CHECK(max_norm >= 0, InvalidArgumentError,
           "[fsdp::clip_grad_norm_] max_norm must be >= 0, got ", max_norm);
  autograd::NoGradGuard no_grad;
  // This rank's sum of squares in float64, then the ranks'.
  double mine = 0;
  for (const Tensor& p : shards)
    if (Tensor g = p.grad(); g.defined() && g.numel() > 0)
      mine += (g.to(kFloat64) * g.to(kFloat64)).sum().to(kCPU).item<double>();
  Tensor squares = full({1}, mine, TensorOptions(kFloat64).with_device(groups[0]->device()));
  for (dist::ProcessGroup* group : groups) group->allreduce(squares)->wait();
  const double total = std::sqrt(squares.to(kCPU).item<double>());
  // As PyTorch's: a non-finite norm makes the gradients NaN or zero.
  const double scale = max_norm / (total + 1e-6);
  if (!(scale >= 1.0))
    for (const Tensor& p : shards)
      if (Tensor g = p.grad(); g.defined()) g.mul_(scale);
  return total;
}

void FSDPModule::unshard() { unit_->finish_gather(Unit::Purpose::kUnshard); }
void FSDPModule::reshard() { unit_->reshard(); }

void FSDPModule::set_flag(bool Unit::*flag, bool value, bool recurse) {
  (*unit_).*flag = value;
  if (recurse)
    for (auto& unit : detail::units_below(unit_->module)) (*unit).*flag = value;
}

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  set_flag(&Unit::sync, sync, recurse);
}
void FSDPModule::set_reshard_after_backward(bool reshard, bool recurse) {
  set_flag(&Unit::reshard_after_backward, reshard, recurse);
}
void FSDPModule::set_requires_all_reduce(bool all_reduce, bool recurse) {
  set_flag(&Unit::all_reduce, all_reduce, recurse);
}

std::vector<Tensor> FSDPModule::shards() const {
  std::vector<Tensor> out;
  for (const ShardedParam& p : unit_->params) out.push_back(p.shard);
  return out;
}

const std::shared_ptr<dist::ProcessGroup>& FSDPModule::group() const { return unit_->group; }

}  // namespace gw::fsdp
