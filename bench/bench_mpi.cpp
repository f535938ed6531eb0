// ProcessGroupMPI allreduce from 4 B to 64 MiB on two ranks of one machine (OpenMPI's shared
// memory), beside raw MPI_Allreduce of the same buffers and beside the Gloo group between the
// same two processes (loopback TCP), in alternating rounds of one run. Then the flat
// reduce_scatter_tensor and all_gather_into_tensor beside raw MPI_Reduce_scatter_block and
// MPI_Allgather (bus bandwidth: whole buffer * (n - 1) / n per second).
//
// Started as a plain program it runs itself under `mpirun -np 2`; rank 0 reports.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "bench/mpi_peers.h"
#include "core/ops.h"
#include "dist/process_group/process_group_mpi.h"
#include "store/launch_env.h"

namespace {

constexpr int kRanks = 2;

// Seconds per call of `op` over `iters` calls, after a warm-up; both ranks start together.
template <typename Op>
double loop(int iters, Op op) {
  for (int i = 0; i < 3; ++i) op();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  if (gw::store::detect_launch_env().launcher != "openmpi") {
    gw::bench::run_under_mpirun("bench_mpi", kRanks, argc, argv);
    report.skip("mpi", "allreduce", "no mpirun (Debian: openmpi-bin)");
    return 0;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    gw::dist::ProcessGroupMPI mpi;
    auto gloo = gw::bench::gloo_beside(mpi);

    for (size_t bytes :
         {size_t{4}, size_t{4} << 10, size_t{256} << 10, size_t{4} << 20, size_t{64} << 20}) {
      const std::string name = "allreduce " + gw::bench::size_label(bytes);
      if (!report.wants("mpi", name)) continue;
      const int n = static_cast<int>(std::max<size_t>(bytes / 4, 1));
      const int iters = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 4, 20000));
      gw::Tensor t = gw::ones({n});  // both reduce the same buffer
      double ours = 1e30, anchor = 1e30, over_gloo = 1e30;
      for (int round = 0; round < 5; ++round) {  // alternating: a busy moment hits all alike
        ours = std::min(ours, loop(iters, [&] { mpi.allreduce(t)->wait(); }));
        anchor = std::min(anchor, loop(iters, [&] {
                            MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), n, MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
                          }));
        over_gloo =
            std::min(over_gloo, loop(std::max(iters / 8, 4), [&] { gloo->allreduce(t)->wait(); }));
      }
      if (rank != 0) continue;
      const double bus = static_cast<double>(bytes) * 2.0 * (kRanks - 1) / kRanks / 1e9;
      if (bytes <= (size_t{4} << 10)) {
        report.add({"mpi", name, ours * 1e6, "us", "raw MPI_Allreduce", anchor * 1e6});
        report.add({"mpi", name, ours * 1e6, "us", "gradwire gloo group", over_gloo * 1e6});
      } else {
        report.add({"mpi", name, bus / ours, "GB/s", "raw MPI_Allreduce", bus / anchor});
        report.add({"mpi", name, bus / ours, "GB/s", "gradwire gloo group", bus / over_gloo});
      }
    }
    for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
      const std::string size = gw::bench::size_label(bytes);
      const bool rs = report.wants("mpi", "reduce_scatter_tensor " + size);
      const bool ag = report.wants("mpi", "all_gather_into_tensor " + size);
      if (!rs && !ag) continue;
      const int chunk = static_cast<int>(bytes / 4 / kRanks);
      const int iters = bytes > (size_t{8} << 20) ? 8 : 40;
      gw::Tensor whole = gw::ones({chunk * kRanks}), mine = gw::ones({chunk});
      double ours_rs = 1e30, raw_rs = 1e30, ours_ag = 1e30, raw_ag = 1e30;
      for (int round = 0; round < 5; ++round) {
        ours_rs =
            std::min(ours_rs, loop(iters, [&] { mpi.reduce_scatter_tensor(mine, whole)->wait(); }));
        raw_rs = std::min(raw_rs, loop(iters, [&] {
                            MPI_Reduce_scatter_block(whole.raw_data(), mine.raw_data(), chunk,
                                                     MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                          }));
        ours_ag = std::min(ours_ag,
                           loop(iters, [&] { mpi.all_gather_into_tensor(whole, mine)->wait(); }));
        raw_ag = std::min(raw_ag, loop(iters, [&] {
                            MPI_Allgather(mine.raw_data(), chunk, MPI_FLOAT, whole.raw_data(),
                                          chunk, MPI_FLOAT, MPI_COMM_WORLD);
                          }));
      }
      if (rank != 0) continue;
      const double bus = static_cast<double>(bytes) * (kRanks - 1) / kRanks / 1e9;
      if (rs)
        report.add({"mpi", "reduce_scatter_tensor " + size, bus / ours_rs, "GB/s",
                    "raw MPI_Reduce_scatter_block", bus / raw_rs});
      if (ag)
        report.add({"mpi", "all_gather_into_tensor " + size, bus / ours_ag, "GB/s",
                    "raw MPI_Allgather", bus / raw_ag});
    }
    gloo->barrier()->wait();
  }
  MPI_Finalize();
  return 0;
}
