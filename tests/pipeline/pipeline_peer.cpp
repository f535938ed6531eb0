// A rank of the multi-process pipeline tests (test_pipeline).
//   pipeline_peer <rank> <world_size> <store_port> steps|die   (Gloo; rank 0 is the test)
//   pipeline_peer mpi steps                                    (under mpirun -np N)
// steps: 1000 steps of the jittery pipeline (tests/pipeline/jittery.h), then checks its
//   gradient: prints "rank R: ok" or the failure, exit code 0 or 1;
// die: ends this process in the middle of step 20 (exit code 3).
#include <cstdlib>
#include <iostream>
#include <string>

#include "dist/process_group/init_process_group.h"
#include "tests/pipeline/jittery.h"

int main(int argc, char** argv) {
  const bool mpi = argc == 3 && std::string(argv[1]) == "mpi";
  if (!mpi && argc != 5) {
    std::cerr << "usage: pipeline_peer <rank> <world_size> <store_port> steps|die, or "
                 "pipeline_peer mpi steps\n";
    return 2;
  }
  const std::string scenario = argv[argc - 1];
  try {
    auto pg = mpi ? gw::dist::init_process_group("mpi")
                  : gw::dist::init_process_group("gloo", std::string("tcp://127.0.0.1:") + argv[3],
                                                 std::atoi(argv[1]), std::atoi(argv[2]));
    const gw::Tensor grad =
        gw::pipeline::testing::run_jittery(pg, 1000, scenario == "die" ? 20 : -1);
    const bool ok = gw::allclose(grad, gw::full({3}, 2.0));
    std::cout << "rank " << pg->rank() << ": " << (ok ? "ok" : "wrong gradient") << std::endl;
    gw::dist::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "pipeline_peer: " << e.what() << "\n";
    return 1;
  }
}
