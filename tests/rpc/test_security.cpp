// What a worker and a store do with connections from outside their job, over real sockets; the
// intruder is another process (rpc_probe), and so is the worker in the descriptor test.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>

#include <asio.hpp>

#include "store/tcp_store.h"
#include "tests/key_file.h"
#include "tests/process_util.h"
#include "tests/rpc/group.h"
#include "tests/rpc/test_functions.h"

using namespace gw;
using namespace gw::rpc;
using namespace gw::rpc::testing;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

using gw::test::KeyFile;

RpcBackendOptions keyed(const store::JobKey& key) {
  RpcBackendOptions o = Group::small_options();
  o.job_key = key;
  return o;
}

// "host", "port" of worker `rank`, as published in the store.
std::pair<std::string, std::string> address_of(store::Store& store, int rank) {
  const std::string v = store.get_string("rpc/worker/" + std::to_string(rank));
  const auto nl1 = v.find('\n'), nl2 = v.rfind('\n');
  return {v.substr(nl1 + 1, nl2 - nl1 - 1), v.substr(nl2 + 1)};
}

// Runs rpc_probe `mode` against worker `target` of `g`, claiming to be worker `as`; its exit code.
int probe(Group& g, const std::string& mode, int target, int as, const std::string& key_path,
          uint64_t first = 1, uint64_t last = 0) {
  const auto [host, port] = address_of(*g.store, target);
  return gw::test::wait_exit(
      gw::test::spawn({GW_RPC_PROBE, mode, host, port, "worker" + std::to_string(target),
                       std::to_string(target), "worker" + std::to_string(as), std::to_string(as),
                       key_path, std::to_string(first), std::to_string(last)}));
}

// This process's mapped memory (an allocation counts even before it is touched).
int64_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  statm >> size;
  return size * ::sysconf(_SC_PAGESIZE);
}

}  // namespace

TEST_CASE("a peer without the key, with a wrong one or replaying a handshake gets nothing run",
          "[rpc][security][process]") {
  KeyFile key;
  Group g(2, keyed(key.key));
  Agent::Use use(g[0]);
  arm_blocked();
  Future<int64_t> pending = rpc_async<int64_t>("worker1", block_until_released);
  const int64_t bumped = bumps();
  // Each claims to be worker1 to worker0, answers call ids 1..64 with forgeries, calls bump.
  for (const char* mode : {"nokey", "wrongkey", "replay"}) {
    INFO(mode);
    CHECK(probe(g, mode, 0, 1, key.path.string(), 1, 64) == 0);  // disconnected, unanswered
  }
  CHECK(bumps() == bumped);                // bump never ran
  CHECK(g[0].num_stray_responses() == 0);  // the forgeries were never even read as frames
  CHECK_FALSE(pending.done());             // ... nor completed the call
  release_blocked();
  CHECK(pending.wait(10s) == 42);          // worker1's real answer
  CHECK(rpc_sync(1, bump) == bumped + 1);  // for the job, bump runs
}

TEST_CASE("an impostor with the key claiming a connected worker is refused; that worker goes on",
          "[rpc][security][process]") {
  KeyFile key;
  Group g(2, keyed(key.key));
  Agent::Use use(g[0]);
  CHECK(rpc_sync(1, whoami) == "worker1");  // worker0 is connected to worker1
  const int64_t bumped = bumps();
  CHECK(probe(g, "impostor", 1, 0, key.path.string()) == 0);
  CHECK(bumps() == bumped);
  CHECK(rpc_sync(1, whoami) == "worker1");
  CHECK(rpc_sync(1, bump) == bumped + 1);
}

TEST_CASE("a flood of unauthenticated and slow connections stops no one and holds no memory",
          "[rpc][security][process]") {
  KeyFile key;
  RpcBackendOptions o = keyed(key.key);
  o.max_unauthenticated_connections = 8;
  o.handshake_timeout = 1s;
  Group g(3, o);
  Agent::Use use(g[0]);
  CHECK(rpc_sync(1, whoami) == "worker1");
  const int64_t before = mapped_bytes();
  // 40 connections to worker1 (5x the cap) that stall in or before the handshake, claim an
  // 896 MiB frame, or trickle; each must be closed within 10x the handshake timeout. (The
  // eviction rule itself is tested in tests/store/test_gatekeeper.cpp.)
  const auto ready = key.dir / "flood.ready";
  auto flood = std::async(std::launch::async, [&] {
    const auto [host, port] = address_of(*g.store, 1);
    return gw::test::wait_exit(gw::test::spawn({GW_RPC_PROBE, "flood", host, port, "worker1", "1",
                                                "worker0", "0", ready.string(), "40", "10000"}));
  });
  // Bounded: the probe exits within 10 s of starting its flood.
  while (!std::filesystem::exists(ready) && flood.wait_for(10ms) != std::future_status::ready) {
  }
  REQUIRE(std::filesystem::exists(ready));
  {
    // A new connection gets in through the flood: worker2's first call to worker1.
    Agent::Use as2(g[2]);
    CHECK(rpc_sync(1, whoami) == "worker1");
  }
  int calls = 0;
  int64_t peak = before;
  while (flood.wait_for(10ms) != std::future_status::ready) {
    CHECK(rpc_sync(1, whoami) == "worker1");  // an authenticated connection keeps working
    ++calls;
    peak = std::max(peak, mapped_bytes());
  }
  CHECK(flood.get() == 0);  // every flood connection was closed by worker1 in time
  CHECK(calls > 0);
  CHECK(peak - before < (512 << 20));  // no 896 MiB frame was ever allocated
}

TEST_CASE("after running out of descriptors, a worker accepts connections again",
          "[rpc][security][process]") {
  namespace auth = store::auth;
  auto store = std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true, 60s);
  // worker1 may open 24 more descriptors once it has joined.
  gw::test::PeerProcesses peer(GW_RPC_PEER, 2, store->port(), {"24"});
  RpcBackendOptions o = Group::small_options();
  o.store = store;
  Agent agent("worker0", 0, 2, o);
  Agent::Use use(agent);
  store->wait({"rpc_peer/limited/1"});
  {
    // 64 connections, each starting a handshake: worker1 answers those it could accept.
    asio::io_context io;
    const std::string v = store->get_string("rpc/worker/1");
    const asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"),
                                     static_cast<uint16_t>(std::stoi(v.substr(v.rfind('\n') + 1))));
    std::vector<asio::ip::tcp::socket> flood;
    std::vector<auth::Challenge> challenges(64);
    int answered = 0;
    for (int i = 0; i < 64; ++i) {
      flood.emplace_back(io).connect(ep);
      auth::ClientHandshake h(store::JobKey::none(), auth::Purpose::kRpc, {"worker0", 0});
      asio::write(flood.back(), asio::buffer(h.hello()));
      asio::async_read(flood.back(), asio::buffer(challenges[static_cast<size_t>(i)]),
                       [&](const std::error_code& ec, size_t) { answered += ec ? 0 : 1; });
    }
    io.run_for(2s);  // bounded: those beyond the descriptors never get an answer
    INFO(answered << " of 64 handshakes answered");
    CHECK(answered > 0);
    CHECK(answered < 64);                   // worker1 ran out of descriptors
  }                                         // ... and all are closed again
  CHECK(rpc_sync(1, whoami) == "worker1");  // a new connection, accepted
  agent.shutdown();
  CHECK(peer.wait() == std::vector<int>{0});
}

TEST_CASE("without a key, listening beyond loopback is refused and says how to fix it",
          "[rpc][security]") {
  RpcBackendOptions o = Group::small_options();
  o.store = std::make_shared<gw::store::HashStore>();
  o.address = "192.0.2.1";  // a documentation address: refused before anything is bound
  CHECK_THROWS_WITH(Agent("worker0", 0, 1, o),
                    Contains("refusing to listen on 192.0.2.1 without a job key") &&
                        Contains("GW_JOB_KEY_FILE") && Contains("GW_ALLOW_UNAUTHENTICATED"));
  store::TCPStoreOptions so;
  so.is_master = true, so.port = 0, so.bind_address = "192.0.2.1";
  CHECK_THROWS_WITH(store::TCPStore("127.0.0.1", so), Contains("without a job key"));
  // Opting out gets as far as binding (which fails here: not an address of this host).
  o.allow_unauthenticated = true;
  CHECK_THROWS_WITH(Agent("worker0", 0, 1, o), Contains("cannot listen on 192.0.2.1"));
}

TEST_CASE("the TCPStore serves nothing to a client without the key", "[rpc][security][process]") {
  KeyFile key;
  store::TCPStoreOptions so;
  so.is_master = true, so.port = 0, so.job_key = key.key, so.timeout = 10s;
  store::TCPStore master("127.0.0.1", so);
  master.set("secret", "s3cr3t");
  // A separate process sends set, get and delete without the key.
  const int rc = gw::test::wait_exit(
      gw::test::spawn({GW_RPC_PROBE, "store", "127.0.0.1", std::to_string(master.port()), "store",
                       "-1", "store-client", "-1", "-"}));
  CHECK(rc == 0);
  CHECK(master.get_string("secret") == "s3cr3t");
  CHECK_FALSE(master.check({"intruder"}));
  // A client with another key: the server fails to prove itself to it, and vice versa.
  store::TCPStoreOptions wrong;
  wrong.port = master.port(), wrong.job_key = store::JobKey::generate(), wrong.timeout = 2s;
  CHECK_THROWS_WITH(store::TCPStore("127.0.0.1", wrong), Contains("failed to prove the job key"));
  // The job's own client is served.
  store::TCPStoreOptions right = wrong;
  right.job_key = key.key;
  store::TCPStore client("127.0.0.1", right);
  CHECK(client.get_string("secret") == "s3cr3t");
}

TEST_CASE("a worker serves at most max_pending_requests_per_peer requests of one peer",
          "[rpc][security]") {
  RpcBackendOptions o = Group::small_options();
  o.max_pending_requests_per_peer = 1;
  Group g(2, o);
  Agent::Use use(g[0]);
  arm_blocked();
  Future<int64_t> pending = rpc_async<int64_t>("worker1", block_until_released);
  // worker1 reads a connection's requests in order: the blocked call holds the one slot.
  CHECK_THROWS_WITH(rpc_sync(1, whoami), Contains("is already serving 1 requests from 'worker0'"));
  auto refused = remote<Tensor>("worker1", "ones", std::vector<int64_t>{2});
  CHECK_THROWS_WITH(refused.to_here(), Contains("max_pending_requests_per_peer"));
  release_blocked();
  CHECK(pending.wait(10s) == 42);
  CHECK(rpc_sync(1, whoami) == "worker1");  // the slot was given back
  CHECK(remote<Tensor>("worker1", "ones", std::vector<int64_t>{2}).to_here().numel() == 2);
}

TEST_CASE("the TCPStore listens only on its host's address", "[rpc][security]") {
  store::TCPStoreOptions so;
  so.is_master = true, so.port = 0, so.timeout = 10s;
  auto refused_at = [](const char* address, uint16_t port) {
    asio::io_context io;
    asio::ip::tcp::socket s(io);
    std::error_code ec;
    s.connect({asio::ip::make_address(address), port}, ec);
    return ec == asio::error::connection_refused;
  };
  {
    store::TCPStore master("localhost", so);  // 127.0.0.1 only
    CHECK_FALSE(refused_at("127.0.0.1", master.port()));
    CHECK(refused_at("127.0.0.2", master.port()));
  }
  // Bound to 127.0.0.2 alone: 127.0.0.1 at its port refuses. Another test's listener may hold
  // that port on 127.0.0.1 by chance (the store's port is any free one on 127.0.0.2): a store
  // listening on every address would be reached on each of five fresh ports.
  so.bind_address = "127.0.0.2";
  bool refused = false;
  for (int attempt = 0; attempt < 5 && !refused; ++attempt) {
    store::TCPStore master("127.0.0.2", so);
    master.set("k", "v");
    refused = refused_at("127.0.0.1", master.port());
  }
  CHECK(refused);
}
