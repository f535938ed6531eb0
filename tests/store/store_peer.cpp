// store_peer: one rank of the multi-process Store test, run as a separate process.
//
//   store_peer tcp <host> <port> <rank> <world_size>
//   store_peer file <path> <rank> <world_size>
//
// Joins the store, counts itself in "arrived", publishes "peer/<rank>", waits for every peer's
// key and checks the values and the counter. Exit 0 only if all of it held.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "store/file_store.h"
#include "store/tcp_store.h"

using namespace gw::store;

namespace {

constexpr Milliseconds kTimeout{60000};

int run(Store& store, int rank, int world_size) {
  store.add("arrived", 1);
  store.set("peer/" + std::to_string(rank), "value-" + std::to_string(rank));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back("peer/" + std::to_string(r));
  store.wait(keys);
  for (int r = 0; r < world_size; ++r) {
    std::string got = store.get_string(keys[r]);
    if (got != "value-" + std::to_string(r)) {
      std::fprintf(stderr, "store_peer %d: %s = '%s'\n", rank, keys[r].c_str(), got.c_str());
      return 2;
    }
  }
  // Everyone adds before publishing its key, so once all keys exist the count is complete.
  std::string arrived = store.get_string("arrived");
  if (arrived != std::to_string(world_size)) {
    std::fprintf(stderr, "store_peer %d: arrived = %s\n", rank, arrived.c_str());
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 5 && args[0] == "tcp") {
      TCPStore store(args[1], static_cast<uint16_t>(std::stoi(args[2])), std::stoi(args[4]), false,
                     kTimeout);
      return run(store, std::stoi(args[3]), std::stoi(args[4]));
    }
    if (args.size() == 4 && args[0] == "file") {
      FileStore store(args[1], std::stoi(args[3]), kTimeout);
      return run(store, std::stoi(args[2]), std::stoi(args[3]));
    }
    std::fprintf(stderr, "usage: store_peer tcp HOST PORT RANK WORLD | file PATH RANK WORLD\n");
    return 64;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_peer: %s\n", e.what());
    return 1;
  }
}
