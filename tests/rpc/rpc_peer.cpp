// A worker process for the multi-process RPC and distributed autograd tests: joins the group
// through the TCPStore the test runs, serves the test functions linked with it, and shuts down
// gracefully.
//   rpc_peer <rank> <world_size> <store_port>
#include <cstdlib>
#include <iostream>
#include <string>

#include "rpc/rpc.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: rpc_peer <rank> <world_size> <store_port>\n";
    return 2;
  }
  try {
    int rank = std::atoi(argv[1]);
    gw::rpc::RpcBackendOptions options;
    options.init_method = std::string("tcp://127.0.0.1:") + argv[3];
    gw::rpc::init_rpc("worker" + std::to_string(rank), rank, std::atoi(argv[2]), options);
    gw::rpc::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rpc_peer: " << e.what() << "\n";
    return 1;
  }
}
