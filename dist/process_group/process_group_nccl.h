// gw::dist::ProcessGroupNCCL — the ProcessGroup for CUDA tensors, on NCCL (c10d's
// ProcessGroupNCCL). One process per GPU.
//
// Rank 0 makes NCCL's unique id and publishes it in the store; every rank builds its
// communicator on its device. A collective first makes the group's own stream wait (on the GPU)
// for what is already queued on the device's current stream, so it sees the tensors as the
// caller left them, then runs there and records an event. A watchdog thread completes the Work
// once the event has passed; when a collective outlives its timeout or NCCL reports an
// asynchronous error (a peer died), it aborts the communicator and fails every pending Work
// with TimeoutError / IoError instead of hanging, and the group is unusable afterwards. A
// GroupLiveness (group_liveness.h) does the same when a rank is declared dead.
//
//   auto pg = gw::dist::init_process_group("nccl", "env://", rank, world_size);
//   gw::Tensor t = gw::ones({4}, gw::cuda_device(local_rank));
//   pg->allreduce(t, {.op = gw::dist::ReduceOp::AVG})->wait();
//
// send and recv run on the same stream, in call order: a ring of sends and receives must post
// its receive first on every other rank, as with PyTorch's NCCL (tags are accepted and ignored).
#pragma once

#include <memory>
#include <string>

#include "dist/process_group/group_liveness.h"
#include "dist/process_group/process_group.h"
#include "store/liveness.h"
#include "store/store.h"

namespace gw::dist {

struct NcclOptions {
  Milliseconds timeout = kDefaultCollectiveTimeout;  // per collective, unless it sets its own
  // This rank's CUDA device, made current on the constructing thread; -1: LOCAL_RANK (which
  // must name a visible device), else the rank modulo the device count.
  int device = -1;
  // A rank silent for this long is declared dead (dist/process_group/group_liveness.h): the
  // communicator is aborted and every pending Work fails with IoError. Default:
  // GW_FAILURE_TIMEOUT (seconds), else 10 s; 0: never.
  Milliseconds failure_timeout = store::kFailureTimeoutFromEnv;
  // The group's name in the flight recorder (debug/flight_recorder.h).
  std::string group_name = "nccl";
};

// Whether this build has the NCCL group and the process sees a CUDA device; otherwise `why`
// (when given) says which is missing, in one line.
bool nccl_available(std::string* why = nullptr);

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  // Builds the communicator with the other ranks (blocks until all of them are there).
  ProcessGroupNCCL(std::shared_ptr<store::Store> store, int rank, int size,
                   NcclOptions options = {});
  ~ProcessGroupNCCL() override;  // waits for pending collectives (within their timeouts)

  std::string backend() const override { return "nccl"; }
  Device device() const override;

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
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<GroupLiveness> liveness_;  // destroyed first: it aborts through impl_
};

}  // namespace gw::dist
