// What the benchmarks run under mpirun share (bench_mpi, bench_fsdp, bench_ddp's MPI rows): the
// mpirun command, and a Gloo group between the same processes for comparison.
#pragma once

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "store/tcp_store.h"

namespace gw::bench {

// `mpirun -np <ranks>` as this machine needs it: more ranks than cores (two cores), and CI runs
// as root.
inline std::vector<std::string> mpirun_args(int ranks) {
  std::vector<std::string> args{"mpirun", "--oversubscribe", "-np", std::to_string(ranks)};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  return args;
}

// Runs the program `name` of the benchmarks' folder again, under `mpirun -np <ranks>`, with the
// arguments this one got; returns only if it cannot start mpirun.
inline void run_under_mpirun(const char* name, int ranks, int argc, char** argv) {
  std::vector<std::string> args = mpirun_args(ranks);
  args.push_back(executable_dir() + "/" + name);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  ::execvp("mpirun", c_args.data());
}

// The store of the Gloo groups between the processes of `group` (an MPI group): rank 0's, its
// port sent over `group`. Every rank calls it.
inline std::shared_ptr<store::Store> store_beside(dist::ProcessGroup& group) {
  const int rank = group.rank(), size = group.size();
  std::shared_ptr<store::TCPStore> store;
  Tensor port = zeros({1}, kInt64);
  if (rank == 0) {
    store =
        std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, size, true, std::chrono::seconds(60));
    port.fill_(static_cast<double>(store->port()));
  }
  group.broadcast(port)->wait();
  if (rank != 0)
    store = std::make_shared<gw::store::TCPStore>("127.0.0.1",
                                                  static_cast<uint16_t>(port.item<int64_t>()), size,
                                                  false, std::chrono::seconds(60));
  return store;
}

// The Gloo group between the processes of `group` (an MPI group). Every rank calls it.
inline std::shared_ptr<dist::ProcessGroupGloo> gloo_beside(dist::ProcessGroup& group) {
  return std::make_shared<dist::ProcessGroupGloo>(store_beside(group), group.rank(), group.size());
}

}  // namespace gw::bench
