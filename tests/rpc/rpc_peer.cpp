// A worker process for the multi-process RPC and distributed autograd tests: joins the group
// through the TCPStore the test runs, serves the test functions linked with it, and shuts down
// gracefully. Built with GW_WITH_DIST (dist_autograd_peer), it starts RPC with gw::dist::init_rpc.
//   rpc_peer <rank> <world_size> <store_port> [<descriptors>]
// With <descriptors>, once joined it may open only that many more file descriptors
// (RLIMIT_NOFILE), for the tests of running out of them; then it sets the store key
// "rpc_peer/limited/<rank>".
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>

#include "rpc/rpc.h"
#include "store/tcp_store.h"
#ifdef GW_WITH_DIST
#include "dist/init_rpc.h"
#endif

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: rpc_peer <rank> <world_size> <store_port> [<descriptors>]\n";
    return 2;
  }
  try {
    int rank = std::atoi(argv[1]);
    gw::rpc::RpcBackendOptions options;
    options.init_method = std::string("tcp://127.0.0.1:") + argv[3];
#ifdef GW_WITH_DIST
    gw::dist::init_rpc("worker" + std::to_string(rank), rank, std::atoi(argv[2]), options);
#else
    gw::rpc::init_rpc("worker" + std::to_string(rank), rank, std::atoi(argv[2]), options);
#endif
    if (argc == 5) {
      gw::store::TCPStore store("127.0.0.1", static_cast<uint16_t>(std::atoi(argv[3])), -1, false);
      const auto open = std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                      std::filesystem::directory_iterator{});
      const rlimit limit{static_cast<rlim_t>(open + std::atoi(argv[4])),
                         static_cast<rlim_t>(open + std::atoi(argv[4]))};
      GW_CHECK(::setrlimit(RLIMIT_NOFILE, &limit) == 0, gw::IoError, "setrlimit failed");
      store.set("rpc_peer/limited/" + std::string(argv[1]), std::string("1"));  // tell the test
    }
    gw::rpc::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rpc_peer: " << e.what() << "\n";
    return 1;
  }
}
