// RPC between real processes over 127.0.0.1, and what a misbehaving peer does to an agent.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <thread>

#include <asio.hpp>

#include "core/ops.h"
#include "rpc/frame_reader.h"
#include "rpc/message.h"
#include "store/tcp_store.h"
#include "tests/process_util.h"
#include "tests/rpc/group.h"
#include "tests/rpc/test_functions.h"
#include "tests/scoped_env.h"

using namespace gw;
using namespace gw::rpc;
using namespace gw::rpc::testing;
using namespace std::chrono_literals;

namespace {

// rpc_peer processes for ranks 1..world_size-1; this process is rank 0 and owns the store.
struct Peers : gw::test::PeerProcesses {
  Peers(int world_size, uint16_t port) : PeerProcesses(GW_RPC_PEER, world_size, port) {}
};

RpcBackendOptions with_store(std::shared_ptr<store::Store> store) {
  RpcBackendOptions o;
  o.store = std::move(store);
  o.num_worker_threads = 4;
  return o;
}

std::shared_ptr<store::TCPStore> master_store() {
  return std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true, std::chrono::seconds(60));
}

// The port worker `rank` listens on, as published in the store.
uint16_t rpc_port(store::Store& store, int rank) {
  std::string v = store.get_string("rpc/worker/" + std::to_string(rank));
  return static_cast<uint16_t>(std::stoi(v.substr(v.rfind('\n') + 1)));
}

// Connects a raw socket to worker `rank` as worker 0 of a job without a key (so proving the
// key), sends `bytes`, and reports whether the agent then closed the connection (reads EOF).
bool agent_closes_after(store::Store& store, int rank, const std::vector<uint8_t>& bytes) {
  namespace auth = store::auth;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), rpc_port(store, rank)});
  // A worker that stops answering fails the test rather than hanging it: reads end after 10 s
  // (plain recv below; asio's blocking reads would wait past the limit).
  timeval limit{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  auto read_exactly = [&](uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t got = ::recv(s.native_handle(), p, n, 0);
      REQUIRE(got > 0);
      p += got, n -= static_cast<size_t>(got);
    }
  };
  auth::ClientHandshake handshake(store::JobKey::none(), auth::Purpose::kRpc, {"worker0", 0});
  asio::write(s, asio::buffer(handshake.hello()));
  auth::Challenge challenge;
  read_exactly(challenge.data(), challenge.size());
  asio::write(s,
              asio::buffer(handshake.answer(challenge, {"worker" + std::to_string(rank), rank})));
  // Admitted: a call on the connection is answered (so the close below is the bytes' doing).
  Message ask;
  ask.id = 1;
  ask.body = Request(Call{"min", {IValue(int64_t{1}), IValue(int64_t{2})}});
  OutgoingFrame f = encode(ask);
  asio::write(s, std::array{asio::buffer(f.prefix),
                            asio::buffer(f.header.begin(), f.header.size() * sizeof(capnp::word))});
  FrameReader reader(1 << 20);
  std::optional<Message> answer;
  for (uint8_t byte; !answer;) {
    read_exactly(&byte, 1);
    reader.feed(&byte, 1);
    answer = reader.take();
  }
  REQUIRE(answer->get<Response>() != nullptr);
  REQUIRE(answer->get<Response>()->value.to_int() == 1);
  asio::write(s, asio::buffer(bytes));
  uint8_t buf[64];
  for (;;) {  // bounded: each read ends within 10 s, and the worker sends nothing more
    const ssize_t got = ::recv(s.native_handle(), buf, sizeof buf, 0);
    if (got <= 0) return got == 0 || errno == ECONNRESET;
  }
}

}  // namespace

TEST_CASE("three processes call each other over TCP and shut down gracefully", "[rpc][process]") {
  auto store = master_store();
  Peers peers(3, store->port());
  Agent agent("worker0", 0, 3, with_store(store));
  Agent::Use use(agent);
  CHECK(rpc_sync("worker1", my_add, ones({2}), ones({2})).to_vector<float>() ==
        std::vector<float>{2.f, 2.f});
  CHECK(rpc_sync(2, whoami) == "worker2");
  Tensor ret = rpc_sync("worker1", async_add_chained, std::string("worker2"), ones({2}), 1, 1);
  CHECK(ret.to_vector<float>() == std::vector<float>{3.f, 3.f});
  Generator gen(3);
  Tensor big = randn({1 << 22}, gen);
  CHECK(gw::equal(rpc_sync<Tensor>("worker2", "clone", big), big));
  // An RRef owned by worker1, passed on to worker2, which fetches the value from worker1.
  auto rref = remote<Tensor>("worker1", "ones", std::vector<int64_t>{3});
  CHECK(rpc_sync("worker2", rref_sum, rref).item<float>() == 3.f);
  auto counter = remote<std::shared_ptr<Counter>>("worker2", "make_counter", 1);
  CHECK(counter.rpc_sync(&Counter::add, 1) == 2);
  agent.shutdown();
  CHECK(peers.wait() == std::vector<int>{0, 0});
}

TEST_CASE("a peer killed mid-call fails the pending call at once, not at the timeout",
          "[rpc][process]") {
  auto store = master_store();
  Peers peers(2, store->port());
  Agent agent("worker0", 0, 2, with_store(store));
  Agent::Use use(agent);
  CHECK(rpc_sync(1, whoami) == "worker1");  // connected and serving
  auto fut = rpc_async("worker1", block_until_released, timeout(600s));
  auto second = rpc_async("worker1", block_until_released, timeout(600s));
  kill(peers.pids()[0], SIGKILL);
  CHECK_THROWS_WITH(fut.wait(), Catch::Contains("connection lost"));
  CHECK_THROWS_AS(second.wait(), IoError);
  CHECK(peers.wait() == std::vector<int>{128 + SIGKILL});
  // A new call to the dead worker fails too, rather than hanging.
  CHECK_THROWS_AS(rpc_sync(1, whoami), IoError);
  agent.shutdown(false);
}

namespace {

// Liveness: this process as worker0 beside `world_size - 1` rpc_peer processes, every agent
// with the failure window `seconds` (GW_FAILURE_TIMEOUT, which the peers inherit).
struct WatchedGroup {
  gw::test::ScopedEnv window;
  std::shared_ptr<store::TCPStore> store = master_store();
  Peers peers;
  Agent agent;
  Agent::Use use{agent};
  WatchedGroup(int world_size, const char* seconds)
      : window(store::kFailureTimeoutEnv, seconds),
        peers(world_size, store->port()),
        agent("worker0", 0, world_size, with_store(store)) {}
};
}  // namespace

TEST_CASE("a stopped peer is declared dead within failure_timeout, not at the call's timeout",
          "[rpc][process][liveness]") {
  WatchedGroup g(2, "1");
  Peers& peers = g.peers;
  Agent& agent = g.agent;
  CHECK(rpc_sync(1, whoami) == "worker1");  // connected
  auto fut = rpc_async("worker1", block_until_released, timeout(600s));
  const auto stopped = std::chrono::steady_clock::now();
  REQUIRE(kill(peers.pids()[0], SIGSTOP) == 0);
  CHECK_THROWS_WITH(fut.wait(),
                    Catch::Contains("worker 'worker1'") && Catch::Contains("no heartbeat for 1 s"));
  const auto took = std::chrono::steady_clock::now() - stopped;
  INFO("declared dead after " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 30s);  // the call's own timeout is 600 s
  // From now on a call to it fails at once, with the same reason.
  CHECK_THROWS_WITH(rpc_sync(1, whoami), Catch::Contains("declared dead"));
  // A graceful shutdown ends within its timeout, naming the dead worker.
  // (worker1 may have stopped before or after it marked its arrival: named either way.)
  CHECK_THROWS_WITH(agent.shutdown(true, 5s),
                    Catch::Contains("worker 'worker1'") && Catch::Contains("no heartbeat"));
  CHECK_FALSE(agent.running());
  kill(peers.pids()[0], SIGKILL);
  CHECK(peers.wait() == std::vector<int>{128 + SIGKILL});
}

TEST_CASE("a peer busy computing, or stopped for less than failure_timeout, stays alive",
          "[rpc][process][liveness]") {
  WatchedGroup g(2, "2");
  Peers& peers = g.peers;
  Agent& agent = g.agent;
  // Its handler holds a worker thread for three windows; its network thread keeps beating.
  CHECK(rpc_sync(1, busy_for_ms, int64_t{6000}) == 6000);
  // Stopped for a quarter of the window, with a call in flight: answered once resumed.
  REQUIRE(kill(peers.pids()[0], SIGSTOP) == 0);
  auto fut = rpc_async(1, whoami);
  std::this_thread::sleep_for(500ms);  // how long it stays stopped (not a synchronisation)
  REQUIRE(kill(peers.pids()[0], SIGCONT) == 0);
  CHECK(fut.wait() == "worker1");
  CHECK(rpc_sync(1, whoami) == "worker1");
  agent.shutdown();
  CHECK(peers.wait() == std::vector<int>{0});
}

TEST_CASE("a graceful shutdown with a killed peer ends at once, naming it", "[rpc][process]") {
  auto store = master_store();
  Peers peers(3, store->port());
  Agent agent("worker0", 0, 3, with_store(store));
  Agent::Use use(agent);
  CHECK(rpc_sync(2, whoami) == "worker2");
  kill(peers.pids()[1], SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  // No timeout (the default): the lost connection ends it.
  CHECK_THROWS_WITH(agent.shutdown(), Catch::Contains("'worker2'") && Catch::Contains("lost"));
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK_FALSE(agent.running());
  CHECK(agent.num_owner_rrefs() == 0);
  kill(peers.pids()[0], SIGKILL);  // worker1 would wait for worker2 for ever
  CHECK(peers.wait() == std::vector<int>{128 + SIGKILL, 128 + SIGKILL});
}

TEST_CASE("a graceful shutdown notices a worker that died without ever being called",
          "[rpc][process][liveness]") {
  WatchedGroup g(3, "1");
  // Nobody ever connected to worker2; its ring neighbour, worker1, probes it once shutdown is
  // slow, finds it gone and fails its own shutdown, which everyone learns through the store.
  REQUIRE(kill(g.peers.pids()[1], SIGKILL) == 0);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(g.agent.shutdown(), IoError);  // no timeout
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK(g.peers.wait() == std::vector<int>{1, 128 + SIGKILL});
}

TEST_CASE("a graceful shutdown with a silent peer returns at its timeout, naming it",
          "[rpc][process]") {
  WatchedGroup g(2, "0");  // nobody is declared dead
  Peers& peers = g.peers;
  Agent& agent = g.agent;
  CHECK(rpc_sync(1, whoami) == "worker1");
  REQUIRE(kill(peers.pids()[0], SIGSTOP) == 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    agent.shutdown(true, 2s);
    FAIL("shutdown returned although worker1 never confirmed");
  } catch (const TimeoutError& e) {
    // Stopped between marking its arrival and being counted, it cannot be told apart.
    CHECK_THAT(e.what(), Catch::Contains("'worker1' did not reach shutdown") ||
                             Catch::Contains("one stopped before it was counted"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK_FALSE(agent.running());
  kill(peers.pids()[0], SIGKILL);
  CHECK(peers.wait() == std::vector<int>{128 + SIGKILL});
}

TEST_CASE("a malformed frame closes only that connection", "[rpc][process]") {
  Group g(2);
  Agent::Use use(g[0]);
  std::vector<uint8_t> garbage(64, 0x5a);
  CHECK(agent_closes_after(*g.store, 1, garbage));
  // A frame whose header is not Cap'n Proto: right magic, nonsense header words.
  std::vector<uint8_t> bad_header{'G', 'W', 'R', '1', 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  bad_header.insert(bad_header.end(), 16, 0xff);
  CHECK(agent_closes_after(*g.store, 1, bad_header));
  CHECK(rpc_sync(1, whoami) == "worker1");  // everyone else is still served
}

TEST_CASE("an oversized frame is refused without allocating it", "[rpc][process]") {
  RpcBackendOptions o = Group::small_options();
  o.max_frame_bytes = 1 << 20;
  Group g(2, o);
  Agent::Use use(g[0]);
  // Claims a 1 TiB payload.
  std::vector<uint8_t> huge{'G', 'W', 'R', '1', 8, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
  CHECK(agent_closes_after(*g.store, 1, huge));
  // A call too large to send fails on its caller, naming the limit; a result too large to send
  // back fails its call. Neither closes the connection under the call pending beside them.
  arm_blocked();
  Future<int64_t> pending = rpc_async<int64_t>("worker1", block_until_released);
  CHECK_THROWS_WITH(rpc_sync<Tensor>("worker1", "clone", ones({1 << 19})),
                    Catch::Contains("exceeds max_frame_bytes 1048576"));
  CHECK_THROWS_WITH(rpc_sync<Tensor>("worker1", "ones", std::vector<int64_t>{1 << 19}),
                    Catch::Contains("exceeds max_frame_bytes 1048576"));
  CHECK(rpc_sync(1, whoami) == "worker1");
  release_blocked();
  CHECK(pending.wait(10s) == 42);
}
