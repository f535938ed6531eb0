// torch.distributed's module-level API: the process's default group, and subgroups.
//
//   gw::dist::init_process_group("gloo");   // rank, world size, master from gwrun/srun/mpirun/...
//   gw::dist::init_process_group("mpi");    // under mpirun: MPI's ranks, shared memory
//   gw::dist::init_process_group("gloo", "env://", rank, world_size);   // MASTER_ADDR/PORT
//   auto pg = gw::dist::default_process_group();
//   auto evens = gw::dist::new_group({0, 2});   // every rank calls it; others get nullptr
//   auto mesh = gw::dist::init_device_mesh({2, 2}, {"dp", "pp"});   // a grid of the ranks
//   auto pipeline = mesh.group("pp");           // this rank's row: ranks 0,1 or 2,3
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

// The default group's ranks as a grid (PyTorch's DeviceMesh): shape {2, 2} with names
// {"dp", "pp"} puts rank r at (r / 2, r % 2), row-major. group(name) is the group of the ranks
// that share this rank's place on every other dimension: with that mesh, ranks 0 and 1 form
// one "pp" group and ranks 0 and 2 one "dp" group. Made by init_device_mesh, on every rank (the
// product of `shape` must be the world size, names distinct).
class DeviceMesh {
 public:
  const std::vector<int>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  std::shared_ptr<ProcessGroup> group(const std::string& name) const;
  // This rank's place along `name`, which is its rank in group(name).
  int coordinate(const std::string& name) const;

 private:
  friend DeviceMesh init_device_mesh(std::vector<int>, std::vector<std::string>, Milliseconds);
  size_t dim(const std::string& name) const;
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coordinates_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
};
DeviceMesh init_device_mesh(std::vector<int> shape, std::vector<std::string> names,
                            Milliseconds timeout = kDefaultCollectiveTimeout);

}  // namespace gw::dist
