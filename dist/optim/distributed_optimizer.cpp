#include "dist/optim/distributed_optimizer.h"

#include <cstring>
#include <map>
#include <mutex>

#include "dist/autograd/dist_autograd.h"

namespace gw::dist {

namespace {
std::shared_ptr<LocalOptimizer> make_local_optimizer(optim::OptimizerOptions options,
                                                     std::vector<rpc::RRef<Tensor>> params) {
  std::vector<Tensor> local;
  for (const auto& p : params) local.push_back(p.local_value());
  return std::make_shared<LocalOptimizer>(options, std::move(local));
}

template <typename V, size_t I = 0>
V variant_from_index(size_t index, std::span<const uint8_t> bytes) {
  if constexpr (I < std::variant_size_v<V>) {
    if (index != I) return variant_from_index<V, I + 1>(index, bytes);
    using T = std::variant_alternative_t<I, V>;
    static_assert(std::is_trivially_copyable_v<T>);
    GW_CHECK(bytes.size() == sizeof(T), IoError, "[DistributedOptimizer] options of ",
             bytes.size(), " bytes, expected ", sizeof(T));
    T out;
    std::memcpy(&out, bytes.data(), sizeof(T));
    return V(out);
  } else {
    throw IoError(gw::detail::str("[DistributedOptimizer] unknown optimizer kind ", index));
  }
}
}  // namespace

void register_local_optimizer() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::functions()
        .add_class<LocalOptimizer>("dist.LocalOptimizer")
        .add_method("step", &LocalOptimizer::step)
        .add_method("state_dict", &LocalOptimizer::state_dict)
        .add_method("load_state_dict", &LocalOptimizer::load_state_dict);
    rpc::functions().add("dist.LocalOptimizer.new", &make_local_optimizer);
  });
}

LocalOptimizer::LocalOptimizer(const optim::OptimizerOptions& options, std::vector<Tensor> params)
    : optimizer_(optim::make_optimizer(std::move(params), options)) {}

void LocalOptimizer::step(int64_t context_id) {
  auto grads = dist::autograd::get_gradients(static_cast<uint64_t>(context_id));
  std::lock_guard lock(optimizer_step_lock());
  optimizer_->step(grads);
}

NamedTensors LocalOptimizer::state_dict() {
  std::lock_guard lock(optimizer_step_lock());
  return optimizer_->state_dict();
}

void LocalOptimizer::load_state_dict(NamedTensors state) {
  std::lock_guard lock(optimizer_step_lock());
  optimizer_->load_state_dict(state);
}

DistributedOptimizer::DistributedOptimizer(const optim::OptimizerOptions& options,
                                           const std::vector<rpc::RRef<Tensor>>& params) {
  GW_CHECK(!params.empty(), InvalidArgumentError, "[DistributedOptimizer] no parameters given");
  std::map<int, std::vector<rpc::RRef<Tensor>>> by_owner;
  for (const auto& p : params) by_owner[p.handle().owner()].push_back(p);
  for (auto& [owner, owned] : by_owner)
    optimizers_.push_back(rpc::remote<std::shared_ptr<LocalOptimizer>>(
        owner, "dist.LocalOptimizer.new", options, std::move(owned)));
}

void DistributedOptimizer::step(uint64_t context_id) {
  std::vector<Future<void>> steps;
  for (const auto& o : optimizers_)
    steps.push_back(o.rpc_async<void>("step", static_cast<int64_t>(context_id)));
  wait_all(steps);
}

NamedTensors DistributedOptimizer::state_dict() const {
  std::vector<Future<NamedTensors>> parts;
  for (const auto& o : optimizers_) parts.push_back(o.rpc_async<NamedTensors>("state_dict"));
  NamedTensors out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string prefix = optimizers_[i].owner_name() + "/";
    for (auto& [key, t] : parts[i].wait()) out.emplace(prefix + key, std::move(t));
  }
  return out;
}

void DistributedOptimizer::load_state_dict(const NamedTensors& state) {
  std::map<std::string, NamedTensors> by_owner;  // owner name -> its part, prefix removed
  for (const auto& o : optimizers_) by_owner[o.owner_name()];
  for (const auto& [key, t] : state) {
    const auto slash = key.find('/');
    auto part = slash == std::string::npos ? by_owner.end() : by_owner.find(key.substr(0, slash));
    GW_CHECK(part != by_owner.end(), InvalidArgumentError,
             "[DistributedOptimizer] load_state_dict: key \"", key,
             "\" names no owner of these parameters (keys are \"<owner name>/<key>\")");
    part->second.emplace(key.substr(slash + 1), t);
  }
  for (const auto& [owner, part] : by_owner)
    GW_CHECK(!part.empty(), InvalidArgumentError,
             "[DistributedOptimizer] load_state_dict: no state for owner '", owner, "'");
  std::vector<Future<void>> loads;
  for (const auto& o : optimizers_)
    loads.push_back(o.rpc_async<void>("load_state_dict", by_owner.at(o.owner_name())));
  wait_all(loads);
}

}  // namespace gw::dist

std::vector<uint8_t> gw::rpc::Serializer<gw::optim::OptimizerOptions>::serialize(
    const gw::optim::OptimizerOptions& o) {
  return std::visit(
      [&](const auto& options) {
        using T = std::decay_t<decltype(options)>;
        static_assert(std::is_trivially_copyable_v<T>);
        std::vector<uint8_t> out(1 + sizeof(T));
        out[0] = static_cast<uint8_t>(o.index());
        std::memcpy(out.data() + 1, &options, sizeof(T));
        return out;
      },
      o);
}

gw::optim::OptimizerOptions gw::rpc::Serializer<gw::optim::OptimizerOptions>::deserialize(
    std::span<const uint8_t> bytes) {
  GW_CHECK(!bytes.empty(), IoError, "[DistributedOptimizer] empty options");
  return gw::dist::variant_from_index<gw::optim::OptimizerOptions>(bytes[0], bytes.subspan(1));
}
