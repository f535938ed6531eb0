// gw::dist::ProcessGroupMPI — the CPU ProcessGroup over MPI (Debian's OpenMPI), for jobs that
// run under `mpirun` or `srun --mpi=pmix`: shared memory between the ranks of a node, the
// cluster's interconnect between nodes, and no store — MPI already knows every rank.
//
//   // mpirun -np 4 ./train
//   auto pg = gw::dist::init_process_group("mpi");   // rank and size from MPI_COMM_WORLD
//   pg->allreduce(t)->wait();
//   auto evens = gw::dist::new_group({0, 2});         // an MPI communicator of ranks 0 and 2
//
// Mental model: the first group initializes MPI (MPI_THREAD_MULTIPLE; a program that
// initialized MPI itself must have asked for that level) and finalizes it at exit, after the
// groups still alive have finished what they queued (make the first group on the main thread:
// MPI wants MPI_Finalize on the thread that initialized it). Each group
// owns a communicator (MPI_COMM_WORLD's duplicate for the world) and runs its collectives in
// call order through a CollectiveQueue: the blocking MPI call runs inline on the thread that
// waits for it, or on the group's thread — a 4-byte allreduce then costs what MPI_Allreduce
// costs. send/recv run beside them, each on its own thread.
//
// Failures follow MPI's rules, not Gloo's:
//   - a rank that dies ends the job: mpirun (or srun) kills the other ranks and exits with a
//     non-zero code, which reaches the user; there is no IoError to catch;
//   - MPI cannot cancel a collective, so one that passes its timeout ends the job too: a
//     watchdog names the operation, the rank and the timeout on stderr, writes the flight
//     recorder's dump, and calls MPI_Abort (as PyTorch's NCCL watchdog tears the process
//     down). Work::wait(timeout) still throws TimeoutError and leaves the collective running.
#pragma once

#include <memory>
#include <string>

#include "dist/process_group/process_group.h"

namespace gw::dist {

struct MpiOptions {
  Milliseconds timeout = kDefaultCollectiveTimeout;  // per collective, unless it sets its own
  // The group's name in the flight recorder (init_process_group: "default_pg", "group<N>").
  std::string group_name = "mpi";
};

// Whether this build has MPI; if not, why (for a skip or an error message).
bool mpi_available(std::string* why = nullptr);

class ProcessGroupMPI final : public ProcessGroup {
 public:
  // The group of every rank of MPI_COMM_WORLD; initializes MPI if needed. Throws StateError
  // when MPI was initialized without MPI_THREAD_MULTIPLE or finalized already.
  explicit ProcessGroupMPI(MpiOptions options = {});
  ~ProcessGroupMPI() override;  // finishes what was queued, frees the communicator

  // A group of `ranks` (sorted, distinct ranks of this group) as a new communicator. Every rank
  // of this group must call it, in the same order; ranks not in `ranks` get nullptr.
  std::shared_ptr<ProcessGroupMPI> subgroup(const std::vector<int>& ranks,
                                            MpiOptions options) const;

  std::string backend() const override { return "mpi"; }

  WorkPtr allreduce(Tensor& tensor, AllreduceOptions options = {}) override;
  WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions options = {}) override;
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
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0, CollectiveOptions options = {}) override;
  WorkPtr recv(Tensor& tensor, int src, int tag = 0, CollectiveOptions options = {}) override;

 private:
  struct Impl;
  explicit ProcessGroupMPI(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace gw::dist
