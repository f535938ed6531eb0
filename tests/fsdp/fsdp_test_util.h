// Helpers of the fully_shard tests run as threads over Gloo (test_fsdp, test_fsdp_errors).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "debug/flight_recorder.h"
#include "dist/process_group/process_group_gloo.h"
#include "nn/module.h"
#include "store/prefix_store.h"

namespace gw::fsdp::testing {

// The group run_ranks lends, as the shared_ptr fully_shard takes (not owned).
inline std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

// HSDP's groups for rank `rank` of 4 as 2 replicas x 2 shards (a mesh (replicate, shard) of
// {2, 2}): shard groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3} (`crossed`:
// {0, 3} and {1, 2}, which pair different places), over `store` (shared by the ranks'
// threads). Every rank makes both, in this order.
struct HsdpGroups {
  std::shared_ptr<dist::ProcessGroup> shard, replicate;
};
inline HsdpGroups hsdp_groups(const std::shared_ptr<store::Store>& store, int rank,
                              bool crossed = false) {
  auto group = [&](const std::string& name, int index, int place) {
    return std::make_shared<dist::ProcessGroupGloo>(
        std::make_shared<store::PrefixStore>(name + std::to_string(index), store), place, 2,
        dist::GlooOptions{.group_name = name});
  };
  auto shard = group("shard", rank / 2, rank % 2);
  return {shard, group("replicate", crossed ? (rank % 2) ^ (rank / 2) : rank % 2, rank / 2)};
}

// The collectives that every rank starts while `f` runs on each, by op, counted in the flight
// recorder (which the ranks' threads share, so the count is over all of them, in every group)
// between barriers of `pg`.
inline std::map<std::string, int> collectives_during(dist::ProcessGroup& pg,
                                                     const std::function<void()>& f) {
  auto events = [] { return nlohmann::json::parse(debug::get_debug_info())["events"]; };
  pg.barrier()->wait();
  const uint64_t before = events().back()["id"].get<uint64_t>();
  pg.barrier()->wait();  // every rank's `before` taken before any collective
  f();
  pg.barrier()->wait();
  std::map<std::string, int> ops;
  const nlohmann::json recorded = events();
  for (const auto& e : recorded)
    if (e["id"].get<uint64_t>() > before && e["op"] != "barrier") ++ops[e["op"].get<std::string>()];
  pg.barrier()->wait();  // every rank counted before any collective again
  return ops;
}
inline int gathers_during(dist::ProcessGroup& pg, const std::function<void()>& f) {
  return collectives_during(pg, f)["all_gather_into_tensor"];
}

// Makes the gradient reaching `module`'s output throw "injected" (from its next call on);
// returns the hook to remove.
inline int64_t throw_in_backward_of(nn::Module& module) {
  return module.register_forward_hook([](nn::Module&, const Tensor&, const Tensor& out) {
    autograd::Edge edge = autograd::gradient_edge(out);
    edge.fn->pre_hooks.emplace_back(
        edge.input_nr, [](const Tensor&) -> Tensor { throw std::runtime_error("injected"); });
    return Tensor();
  });
}

}  // namespace gw::fsdp::testing
