// A rank for the multi-process process-group tests; rank 0 is the test, which runs the store.
//   pg_peer <rank> <world_size> <store_port> collectives|die|idle|busy
// collectives: every collective (collective_checks.h) and a subgroup allreduce, the sequence
// test_pg_multiprocess runs on rank 0; each rank checks its own results;
// die: exits right after a first barrier, as a crash would;
// idle: after a first barrier, one allreduce (which the test may keep waiting), then a barrier;
// busy: after a first barrier, computes for 6 s, then one allreduce and a barrier.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "tests/dist/process_group/collective_checks.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: pg_peer <rank> <world_size> <store_port> collectives|die|idle|busy\n";
    return 2;
  }
  const int rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  const std::string scenario = argv[4];
  try {
    auto pg = gw::dist::init_process_group("gloo", std::string("tcp://127.0.0.1:") + argv[3],
                                           rank, world);
    if (scenario == "die") {  // once rank 0 is connected too
      pg->barrier()->wait();
      std::_Exit(3);
    }
    if (scenario == "idle" || scenario == "busy") {
      pg->barrier()->wait();
      if (scenario == "busy") {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
        volatile uint64_t spins = 0;
        while (std::chrono::steady_clock::now() < until) spins = spins + 1;  // bounded
      }
      gw::Tensor t = gw::ones({4});
      pg->allreduce(t)->wait();
      pg->barrier()->wait();
      gw::dist::destroy_process_group();
      return 0;
    }
    gw::dist::testing::Checks checks;
    gw::dist::testing::check_every_collective(*pg, checks);
    if (auto pair = gw::dist::new_group({0, 1})) {  // null on the ranks outside it
      gw::Tensor u = gw::ones({2}) * static_cast<double>(rank + 1);
      pair->allreduce(u)->wait();
      EXPECT(checks, gw::allclose(u, gw::full({2}, 3.0)));
    }
    for (const auto& f : checks.failures) std::cerr << "pg_peer " << rank << ": " << f << "\n";
    const bool ok = checks.failures.empty();
    pg->barrier()->wait();
    gw::dist::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "pg_peer " << rank << ": " << e.what() << "\n";
    return 1;
  }
}
