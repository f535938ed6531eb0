// The real thing: separate processes meeting in a TCPStore served by this process, and in a
// FileStore.
#include <catch2/catch.hpp>

#include "store/file_store.h"
#include "store/tcp_store.h"
#include "tests/store/store_test_util.h"

#ifndef GW_STORE_PEER
#error "GW_STORE_PEER must name the store_peer executable"
#endif

using namespace gw::store;
using namespace gw::store::test;

namespace {

constexpr int kPeers = 3;

// Spawns the peers with `args(rank)`, then checks what they left in `store`.
void run_peers(Store& store, const std::function<std::vector<std::string>(int)>& args) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kPeers; ++rank) {
    std::vector<std::string> argv = {GW_STORE_PEER};
    for (auto& a : args(rank)) argv.push_back(a);
    pids.push_back(spawn(argv));
  }
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(wait_exit(pid));
  CHECK(codes == std::vector<int>(kPeers, 0));
  CHECK(store.get_string("arrived") == std::to_string(kPeers));
  for (int rank = 0; rank < kPeers; ++rank)
    CHECK(store.get_string("peer/" + std::to_string(rank)) == "value-" + std::to_string(rank));
}

}  // namespace

TEST_CASE("TCPStore rendezvous across processes", "[store][multiprocess]") {
  TCPStore master("127.0.0.1", 0, kPeers + 1, true, milliseconds(60000));
  const std::string port = std::to_string(master.port());
  run_peers(master, [&](int rank) {
    return std::vector<std::string>{"tcp", "127.0.0.1", port, std::to_string(rank),
                                    std::to_string(kPeers)};
  });
}

TEST_CASE("FileStore rendezvous across processes", "[store][multiprocess]") {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  FileStore store(path, kPeers, milliseconds(60000));
  run_peers(store, [&](int rank) {
    return std::vector<std::string>{"file", path, std::to_string(rank), std::to_string(kPeers)};
  });
}
