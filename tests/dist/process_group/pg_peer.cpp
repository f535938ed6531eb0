// A rank for the multi-process process-group tests; rank 0 is the test, which runs the store.
//   pg_peer <rank> <world_size> <store_port> collectives|die
// collectives: the sequence test_pg_multiprocess runs on rank 0, checking its own results;
// die: exits right after a first barrier, as a crash would.
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/ops.h"
#include "dist/process_group/init.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: pg_peer <rank> <world_size> <store_port> collectives|die\n";
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
    gw::Tensor t = gw::ones({4}) * static_cast<double>(rank + 1);
    pg->allreduce(t)->wait();
    bool ok = gw::allclose(t, gw::full({4}, world * (world + 1) / 2.0));
    auto pair = gw::dist::new_group({0, 1});
    if (pair) {
      gw::Tensor u = gw::ones({2}) * static_cast<double>(rank + 1);
      pair->allreduce(u)->wait();
      ok = ok && gw::allclose(u, gw::full({2}, 3.0));
    }
    pg->barrier()->wait();
    gw::dist::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "pg_peer " << rank << ": " << e.what() << "\n";
    return 1;
  }
}
