// gw::dist::ProcessGroupGloo — the CPU ProcessGroup, on Gloo (Debian's libgloo).
//
// The ranks find each other through a gw::store::Store (an adapter gives Gloo the store it
// expects) and connect a full mesh of TCP pairs. Collectives run in call order on one worker
// thread per group; each gets the next tag, which is the same on every rank because every rank
// calls the same collectives in the same order. send/recv run beside them. A GroupLiveness
// (group_liveness.h) fails everything pending, on every rank, once a rank is declared dead.
// When every rank is on this host, allreduce, reduce-scatter, all-gather, broadcast and barrier
// (DDP's buckets, FSDP's shards, ZeRO's parameters) go through one shared memory segment instead
// of loopback TCP (shm_collectives.h); the rest stays on Gloo.
//
//   auto store = std::make_shared<gw::store::HashStore>();        // threads as ranks
//   gw::dist::ProcessGroupGloo pg(store, rank, world_size);
//   pg.allreduce(t, {.op = gw::dist::ReduceOp::MAX})->wait();
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dist/process_group/group_liveness.h"
#include "dist/process_group/process_group.h"
#include "store/liveness.h"
#include "store/store.h"

namespace gw::dist {

struct GlooOptions {
  Milliseconds timeout = kDefaultCollectiveTimeout;  // per collective, unless it sets its own
  std::string hostname = "127.0.0.1";                // the address the pairs listen on
  // A rank silent for this long is declared dead (dist/process_group/group_liveness.h): every rank
  // then fails its pending Works with IoError instead of waiting out `timeout`. Default:
  // GW_FAILURE_TIMEOUT (seconds), else 10 s; 0: never.
  Milliseconds failure_timeout = store::kFailureTimeoutFromEnv;
  // The group's name in the flight recorder (debug/flight_recorder.h): init_process_group
  // names its groups "default_pg" and new_group's "group<N>".
  std::string group_name = "gloo";
  // Allreduce, reduce-scatter, all-gather, broadcast and barrier through shared memory when
  // every rank is on this host (same boot, network and pid namespaces, and user). Unset: on, unless
  // GW_GLOO_SHM=0. A rank that does not want it turns it off for the whole group.
  std::optional<bool> shared_memory = std::nullopt;
};

class ProcessGroupGloo final : public ProcessGroup {
 public:
  // Connects to every other rank through `store` (which several groups may share: give each
  // its own PrefixStore). Throws TimeoutError if the others do not come within the timeout.
  ProcessGroupGloo(std::shared_ptr<store::Store> store, int rank, int size,
                   GlooOptions options = {});
  ~ProcessGroupGloo() override;  // finishes what was queued

  std::string backend() const override { return "gloo"; }
  // Whether those go through shared memory (GlooOptions::shared_memory); the same on
  // every rank.
  bool uses_shared_memory() const;
  bool coalesces_in_place() const override { return uses_shared_memory(); }

  WorkPtr allreduce(Tensor& tensor, AllreduceOptions options = {}) override;
  WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors,
                              AllreduceOptions options = {}) override;
  WorkPtr broadcast(Tensor& tensor, BroadcastOptions options = {}) override;
  WorkPtr reduce(Tensor& tensor, ReduceOptions options = {}) override;
  WorkPtr allgather(std::vector<Tensor>& outputs, const Tensor& input,
                    CollectiveOptions options = {}) override;
  WorkPtr gather(std::vector<Tensor>& outputs, const Tensor& input,
                 GatherOptions options = {}) override;
  WorkPtr scatter(Tensor& output, const std::vector<Tensor>& inputs,
                  ScatterOptions options = {}) override;
  WorkPtr reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                         CollectiveOptions options = {}) override;
  WorkPtr all_gather_into_tensor(Tensor& output, const Tensor& input,
                                 CollectiveOptions options = {}) override;
  WorkPtr reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                CollectiveOptions options = {}) override;
  WorkPtr alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                   CollectiveOptions options = {}) override;
  WorkPtr barrier(CollectiveOptions options = {}) override;
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0,
               CollectiveOptions options = {}) override;
  WorkPtr recv(Tensor& tensor, int src, int tag = 0, CollectiveOptions options = {}) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the Works, which may run their collective
  std::unique_ptr<GroupLiveness> liveness_;
};

}  // namespace gw::dist
