// torch.distributed's module-level API: the process's default group, and subgroups.
//
//   gw::dist::init_process_group("gloo");   // rank, world size, master from gwrun/srun/mpirun/...
//   gw::dist::init_process_group("mpi");    // under mpirun: MPI's ranks, shared memory
//   gw::dist::init_process_group("gloo", "env://", rank, world_size);   // MASTER_ADDR/PORT
//   auto pg = gw::dist::default_process_group();
//   auto evens = gw::dist::new_group({0, 2});   // every rank calls it; others get nullptr
//   gw::dist::destroy_process_group();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/process_group/process_group_gloo.h"
#include "dist/process_group/process_group_mpi.h"
#include "dist/process_group/process_group_nccl.h"

namespace gw::dist {

// Creates the default group. `backend` is "gloo" (CPU tensors), "mpi" (CPU tensors, in a build
// with MPI, under mpirun or srun --mpi=pmix: process_group_mpi.h; no store, no rendezvous, and
// a rank and world size given must be MPI's) or "nccl" (CUDA tensors, in a build with NCCL;
// one process per GPU, the device from LOCAL_RANK); throws
// InvalidArgumentError for others, and StateError if a default group exists already. Gloo's
// pairs listen on the address the other hosts reach this one on (store/net_address.h:
// GW_SOCKET_IFNAME's interface, else the one routing to the master; loopback for a store
// given directly unless GW_SOCKET_IFNAME is set).
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 const std::string& init_method, int rank,
                                                 int world_size,
                                                 Milliseconds timeout = kDefaultCollectiveTimeout);
// The same with the rank, world size and master of whichever launcher started this process
// (gwrun, torchrun, srun, mpirun, a PyTorchJob: store/launch_env.h).
//   gw::dist::init_process_group("gloo");
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 Milliseconds timeout = kDefaultCollectiveTimeout);
// The same over a store the caller made.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 std::shared_ptr<store::Store> store, int rank,
                                                 int world_size,
                                                 Milliseconds timeout = kDefaultCollectiveTimeout);

// StateError if init_process_group was not called.
std::shared_ptr<ProcessGroup> default_process_group();
// monitored_barrier on the default group: names the ranks that do not arrive within `timeout`.
void monitored_barrier(Milliseconds timeout = kDefaultCollectiveTimeout);
bool is_initialized();
void destroy_process_group();

// A group of the default group's `ranks` (sorted, distinct), on the default group's backend.
// Every rank of the default group must call it, in the same order as the others; ranks not in
// `ranks` get nullptr.
std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks,
                                        Milliseconds timeout = kDefaultCollectiveTimeout);

}  // namespace gw::dist
