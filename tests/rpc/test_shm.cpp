// Shared memory between RPC workers on one host (rpc/shm.h, rpc/connection.h): the segment's
// rings on their own, then agents that choose it (or not), and a peer killed mid-transfer.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <future>
#include <numeric>
#include <thread>

#include "core/ops.h"
#include "rpc/shm.h"
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

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + i / 251);
  return v;
}

// Reads everything `seg` has, up to `want` bytes in all, into `out`.
void read_all(shm::Segment& seg, std::vector<uint8_t>& out, size_t want) {
  for (int i = 0; i < 4 && out.size() < want; ++i) {  // at most two contiguous parts ready
    auto r = seg.readable();
    out.insert(out.end(), r.begin(), r.end());
    seg.consume(r.size());
  }
}

RpcBackendOptions options_with(std::shared_ptr<store::Store> store, bool shared_memory) {
  RpcBackendOptions o = Group::small_options();
  o.store = std::move(store);
  o.shared_memory = shared_memory;
  return o;
}

// This process as worker0 beside an rpc_peer process as worker1, shared memory on for both.
struct PeerProcess {
  gw::test::ScopedEnv on{"GW_RPC_SHM", "1"};  // the peer inherits it
  std::shared_ptr<store::TCPStore> store =
      std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true, 60s);
  gw::test::PeerProcesses peers{GW_RPC_PEER, 2, store->port()};
  Agent agent{"worker0", 0, 2, options_with(store, true)};
  Agent::Use use{agent};

  // Opens the connection to worker1 and checks that it went over to shared memory.
  void connect() {
    CHECK(rpc_sync(1, whoami) == "worker1");
    REQUIRE(agent.link(1) == "shm");
  }
};

}  // namespace

TEST_CASE("a segment's rings carry bytes both ways, wrapping around, and never overfill",
          "[rpc][shm]") {
  constexpr uint64_t kRing = shm::kMinRingBytes;
  auto a = shm::Segment::create(kRing);
  auto b = shm::Segment::attach(a->offer());
  a->close_fd();
  CHECK(b->readable().empty());
  // Three rounds of 40 KiB each way: the second and third wrap around the 64 KiB ring.
  for (uint8_t round = 0; round < 3; ++round) {
    const auto there = pattern(40 * 1024, round), back = pattern(40 * 1024, round + 100);
    REQUIRE(a->write(there.data(), there.size()) == there.size());
    REQUIRE(b->write(back.data(), back.size()) == back.size());
    std::vector<uint8_t> got_there, got_back;
    read_all(*b, got_there, there.size());
    read_all(*a, got_back, back.size());
    CHECK(got_there == there);
    CHECK(got_back == back);
  }
  // A full ring takes no more until its reader consumes.
  const auto big = pattern(kRing + 1000, 9);
  CHECK(a->write(big.data(), big.size()) == kRing);
  CHECK(a->out_full());
  CHECK(a->write(big.data(), 1) == 0);
  auto r = b->readable();
  b->consume(r.size());
  CHECK_FALSE(a->out_full());
}

TEST_CASE("attaching refuses another host, a wrong token and a wrong size", "[rpc][shm]") {
  auto a = shm::Segment::create(shm::kMinRingBytes);
  shm::Offer o = a->offer();
  shm::Offer other_host = o;
  other_host.host = "another-boot/net:1/pid:1/uid:0";
  CHECK_THROWS_WITH(shm::Segment::attach(other_host), Catch::Contains("another host"));
  shm::Offer wrong_token = o;
  wrong_token.token[0] ^= 1;
  CHECK_THROWS_WITH(shm::Segment::attach(wrong_token), Catch::Contains("does not hold"));
  shm::Offer wrong_size = o;
  wrong_size.ring_bytes *= 2;
  CHECK_THROWS_WITH(shm::Segment::attach(wrong_size), Catch::Contains("offered size"));
  shm::Offer no_fd = o;
  a->close_fd();
  CHECK_THROWS_WITH(shm::Segment::attach(no_fd), Catch::Contains("cannot open"));
}

TEST_CASE("a sleeping ring thread is woken by its peer's write", "[rpc][shm]") {
  auto a = shm::Segment::create(shm::kMinRingBytes);
  auto b = shm::Segment::attach(a->offer());
  // b sleeps for up to 20 s unless rung; a writes once it sees b asleep.
  auto slept = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    b->sleep([&] { return !b->readable().empty(); }, 20s);
    return std::chrono::steady_clock::now() - start;
  });
  const auto limit = std::chrono::steady_clock::now() + 10s;
  while (!a->peer_sleeping() && std::chrono::steady_clock::now() < limit)  // bounded
    std::this_thread::yield();
  REQUIRE(a->peer_sleeping());
  const uint8_t byte = 42;
  REQUIRE(a->write(&byte, 1) == 1);
  CHECK(slept.get() < 10s);  // rung, not timed out
  CHECK(b->readable().size() == 1);
  CHECK_FALSE(a->peer_sleeping());
}

TEST_CASE("agents on one host talk through shared memory, and report it", "[rpc][shm]") {
  gw::test::ScopedEnv on("GW_RPC_SHM", "1");  // whichever transport the suite runs on
  RpcBackendOptions o = Group::small_options();
  o.shm_ring_bytes = shm::kMinRingBytes;  // small, so that the tensors below wrap it many times
  Group g(2, o);
  Agent::Use use(g[0]);
  CHECK(g[0].link("worker1") == "none");  // nothing sent yet
  CHECK(rpc_sync(1, whoami) == "worker1");
  CHECK(g[0].link("worker1") == "shm");
  // Larger than the ring each way, with every byte checked; several at once.
  Generator gen(5);
  std::vector<Tensor> xs;
  std::vector<Future<Tensor>> futs;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(randn({(1 << 18) + 3 * i}, gen));  // 1 MiB and a little more
    futs.push_back(rpc_async<Tensor>(1, "clone", xs.back()));
  }
  for (int i = 0; i < 4; ++i) CHECK(gw::equal(futs[i].wait(), xs[i]));
  // worker1's answers came back on the connection worker0 opened: through its ring too.
  CHECK(rpc_sync(1, whoami) == "worker1");
  g.shutdown();
}

TEST_CASE("frames keep their order across the switch from TCP to shared memory", "[rpc][shm]") {
  gw::test::ScopedEnv on("GW_RPC_SHM", "1");
  RpcBackendOptions o = Group::small_options();
  o.num_worker_threads = 1;  // worker1 runs the calls in the order they arrive
  Group g(2, o);
  Agent::Use use(g[0]);
  // Sent at once, before any answer: the first ones go over TCP while shared memory is being
  // negotiated, the later ones through the ring.
  std::vector<Future<int64_t>> futs;
  for (int i = 0; i < 300; ++i) futs.push_back(rpc_async<int64_t>(1, "bump"));
  std::vector<int64_t> got;
  for (auto& f : futs) got.push_back(f.wait());
  std::vector<int64_t> expected(got.size());
  std::iota(expected.begin(), expected.end(), got.front());
  CHECK(got == expected);
  CHECK(g[0].link(1) == "shm");
}

TEST_CASE("shared memory is off when either side turns it off, and under GW_RPC_SHM=0",
          "[rpc][shm]") {
  SECTION("the accepting side declines") {
    auto store = std::make_shared<gw::store::HashStore>();
    auto b = std::async(std::launch::async, [&] {
      return std::make_unique<Agent>("worker1", 1, 2, options_with(store, false));
    });
    Agent a("worker0", 0, 2, options_with(store, true));
    auto peer = b.get();
    Agent::Use use(a);
    CHECK(rpc_sync<Tensor>(1, "clone", ones({1000})).sum().item<float>() == 1000.f);
    CHECK(a.link(1) == "tcp");
    auto done = std::async(std::launch::async, [&] { peer->shutdown(); });
    a.shutdown();
    done.get();
  }
  SECTION("GW_RPC_SHM=0") {
    gw::test::ScopedEnv off("GW_RPC_SHM", "0");
    Group g(2);
    Agent::Use use(g[0]);
    CHECK(rpc_sync(1, whoami) == "worker1");
    CHECK(g[0].link(1) == "tcp");
  }
}

TEST_CASE("a bad shm_ring_bytes is refused by name", "[rpc][shm]") {
  RpcBackendOptions o = options_with(std::make_shared<gw::store::HashStore>(), true);
  o.shm_ring_bytes = 1000;
  CHECK_THROWS_WITH(Agent("worker0", 0, 1, o), Catch::Contains("shm_ring_bytes 1000"));
}

TEST_CASE("what a peer wrote into the ring before it exited is still delivered",
          "[rpc][shm][process]") {
  PeerProcess p;
  const int64_t before = bumps();
  // worker1 calls bump here, then sends 3000 more without waiting and exits at once: its
  // socket closes right behind them, while most are still in the ring (handling them takes
  // longer than the close takes to arrive).
  constexpr int64_t kSent = 3000;
  CHECK_THROWS_AS(rpc_sync<int64_t>(1, "bump_then_exit", std::string("worker0"), kSent), IoError);
  CHECK(p.peers.wait() == std::vector<int>{0});
  const auto limit = std::chrono::steady_clock::now() + 20s;
  while (bumps() < before + 1 + kSent && std::chrono::steady_clock::now() < limit)  // bounded
    std::this_thread::yield();
  CHECK(bumps() == before + 1 + kSent);
  p.agent.shutdown(false);
}

TEST_CASE("a peer that dies while a callback holds the ring thread still fails its calls",
          "[rpc][shm][process]") {
  PeerProcess p;
  p.connect();
  // The answer's callback runs on the connection's ring thread and holds it until released.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> entered{false};
  auto held = rpc_async<std::string>(1, "whoami").then([&](Future<std::string>& f) {
    entered = true;
    released.wait_for(60s);  // bounded: released below
    return f.wait();
  });
  const auto limit = std::chrono::steady_clock::now() + 10s;
  while (!entered && std::chrono::steady_clock::now() < limit)  // bounded
    std::this_thread::yield();
  REQUIRE(entered);
  auto pending = rpc_async("worker1", block_until_released, timeout(600s));
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(kill(p.peers.pids()[0], SIGKILL) == 0);
  CHECK_THROWS_AS(pending.wait(), IoError);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_FALSE(held.done());  // the callback still holds the ring thread
  release.set_value();
  CHECK(held.wait() == "worker1");
  CHECK(p.peers.wait() == std::vector<int>{128 + SIGKILL});
  p.agent.shutdown(false);
}

TEST_CASE("a peer process killed mid-transfer over shared memory fails the call at once",
          "[rpc][shm][process]") {
  PeerProcess p;
  p.connect();
  // Stopped, the peer takes nothing from the ring: 64 MiB cannot fit in its 4 MiB, so the
  // call is still being written when the peer dies.
  REQUIRE(kill(p.peers.pids()[0], SIGSTOP) == 0);
  auto fut = rpc_async<Tensor>(1, "clone", ones({16 << 20}), timeout(600s));
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(kill(p.peers.pids()[0], SIGKILL) == 0);
  CHECK_THROWS_AS(fut.wait(), IoError);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(p.peers.wait() == std::vector<int>{128 + SIGKILL});
  CHECK_THROWS_AS(rpc_sync(1, whoami), IoError);
  p.agent.shutdown(false);
}

TEST_CASE("a writer asleep on a full ring is woken by its reader's consume", "[rpc][shm]") {
  auto a = shm::Segment::create(shm::kMinRingBytes);
  auto b = shm::Segment::attach(a->offer());
  const auto fill = pattern(shm::kMinRingBytes, 3);
  REQUIRE(a->write(fill.data(), fill.size()) == fill.size());
  REQUIRE(a->out_full());
  // a's ring thread waits for room for up to 20 s unless rung; b consumes once it sees a asleep.
  auto slept = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    a->sleep([&] { return !a->out_full(); }, 20s);
    return std::chrono::steady_clock::now() - start;
  });
  const auto limit = std::chrono::steady_clock::now() + 10s;
  while (!b->peer_sleeping() && std::chrono::steady_clock::now() < limit)  // bounded
    std::this_thread::yield();
  REQUIRE(b->peer_sleeping());
  b->consume(1);
  CHECK(slept.get() < 10s);  // rung, not timed out
  CHECK_FALSE(a->out_full());
}
