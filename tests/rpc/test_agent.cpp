// RPC between agents that are threads of this process (see group.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "core/ops.h"
#include "tests/process_util.h"
#include "tests/rpc/group.h"
#include "tests/rpc/test_functions.h"
#include "tests/skip.h"

using namespace gw;
using namespace gw::rpc;
using namespace gw::rpc::testing;
using namespace std::chrono_literals;

TEST_CASE("rpc_sync runs a registered function on the callee", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  Tensor r = rpc_sync("worker1", my_add, ones({2}), full({2}, 2.f));
  CHECK(r.to_vector<float>() == std::vector<float>{3.f, 3.f});
  // By rank and by WorkerInfo, and the builtin add with a Scalar (the first example of
  // pytorch.org/docs/stable/rpc.html).
  CHECK(rpc_sync<Tensor>(1, "add", ones({2}), 3).to_vector<float>() == std::vector<float>{4, 4});
  CHECK(rpc_sync<Tensor>(get_worker_info("worker1"), "add", ones({2}), 3).sum().item<float>() == 8);
  CHECK(rpc_sync(1, whoami) == "worker1");
  CHECK(rpc_sync(0, whoami) == "worker0");  // a worker may call itself
}

TEST_CASE("rpc_async returns futures that complete with the results", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  auto fut1 = rpc_async<Tensor>("worker1", "add", ones({2}), 3);
  auto fut2 = rpc_async<int64_t>("worker1", "min", 1, 2);
  Tensor result = fut1.wait() + fut2.wait();
  CHECK(result.to_vector<float>() == std::vector<float>{5.f, 5.f});
  std::vector<Future<int64_t>> many;
  for (int64_t i = 0; i < 64; ++i) many.push_back(rpc_async<int64_t>("worker1", "max", i, 10));
  auto values = wait_all(many);
  for (int64_t i = 0; i < 64; ++i) CHECK(values[i] == std::max<int64_t>(i, 10));
}

TEST_CASE("tensors of every dtype and size round trip exactly", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  for (DType dt : {kFloat32, kFloat64, kInt64, kInt32, kBool}) {
    Tensor t = arange(0, 1000).to(dt).reshape({10, 100});
    Tensor back = rpc_sync<Tensor>("worker1", "clone", t);
    CHECK(back.dtype() == dt);
    CHECK(back.sizes() == t.sizes());
    CHECK(back.to(kFloat64).to_vector<double>() == t.to(kFloat64).to_vector<double>());
  }
  Generator gen(7);
  Tensor big = randn({4, 1 << 20}, gen);  // 16 MiB: read straight into tensor storage
  Tensor back = rpc_sync<Tensor>("worker1", "clone", big);
  CHECK(gw::equal(back, big));
  // A non-contiguous view travels as its own elements.
  Tensor view = big.t().slice(0, 5, 9);
  CHECK(gw::equal(rpc_sync<Tensor>("worker1", "clone", view), view.contiguous()));
  CHECK(rpc_sync<Tensor>("worker1", "clone", zeros({0, 3})).sizes() == Shape{0, 3});
}

TEST_CASE("optionals, pairs, tuples, vectors and user types cross the wire", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  auto [n, s, p, ts] = rpc_sync("worker1", kinds, std::optional<int64_t>(7),
                                std::pair<double, std::string>(3.0, "x"), Point{1.5, 2.5},
                                std::vector<Tensor>{ones({2}), zeros({1})});
  CHECK(n == 7);
  CHECK(s == "x3");
  CHECK(p.x == 2.5);
  CHECK(p.y == 1.5);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to_vector<float>() == std::vector<float>{1, 1, 0});
  CHECK(std::get<0>(rpc_sync("worker1", kinds, std::optional<int64_t>(),
                             std::pair<double, std::string>(0, ""), Point{},
                             std::vector<Tensor>{ones({1})})) == -1);
  // Builtins returning several tensors, and taking shapes.
  auto parts = rpc_sync<std::vector<Tensor>>("worker1", "split", arange(0, 6), 4, 0);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].to_vector<int64_t>() == std::vector<int64_t>{4, 5});
  CHECK(rpc_sync<Tensor>("worker1", "permute", ones({2, 3}), Shape{1, 0}).sizes() == Shape{3, 2});
  // A class constructor registered by name: the object stays on worker1.
  auto c = remote<std::shared_ptr<Counter>>("worker1", "Counter");
  CHECK(c.rpc_sync(&Counter::add, 3) == 3);
}

TEST_CASE("a callee's exception arrives as RemoteError naming the worker", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  try {
    rpc_sync("worker1", fail_with, std::string("boom"));
    FAIL("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(std::string(e.what()) == "[worker1] boom");
  }
  // Not a gw::Error on the callee: a plain RemoteError.
  try {
    rpc_sync("worker1", fail_as, std::string("std"), std::string("plain"));
    FAIL("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.code() == ErrorCode::kRemote);
    CHECK(dynamic_cast<const TimeoutError*>(&e) == nullptr);
    CHECK(std::string(e.what()) == "[worker1] plain");
  }
  // Not even a std::exception: the callee survives it and says so.
  try {
    rpc_sync("worker1", fail_as, std::string("int"), std::string());
    FAIL("no exception");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(std::string(e.what()).find("not a std::exception") != std::string::npos);
  }
  CHECK(rpc_sync("worker1", whoami) == "worker1");
}

TEST_CASE("a callee's gradwire error is raised on the caller as the same type", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  // Caught as its own type first: a remote timeout is a TimeoutError the caller can handle as
  // one, and RemoteError's worker() still says where it happened.
  try {
    rpc_sync("worker1", fail_as, std::string("timeout"), std::string("too slow"));
    FAIL("no exception");
  } catch (const TimeoutError& e) {
    CHECK(e.code() == ErrorCode::kTimeout);
    CHECK(std::string(e.what()) == "[worker1] too slow");
    const auto* remote = dynamic_cast<const RemoteError*>(&e);
    REQUIRE(remote != nullptr);
    CHECK(remote->worker() == "worker1");
  }
  CHECK_THROWS_AS(rpc_sync("worker1", fail_with, std::string("bad")), InvalidArgumentError);
  CHECK_THROWS_AS(rpc_sync("worker1", fail_as, std::string("state"), std::string("x")), StateError);
  // Unknown functions are refused by the callee with InvalidArgumentError, as locally.
  try {
    rpc_sync("worker1", "no_such_function");
    FAIL("no exception");
  } catch (const InvalidArgumentError& e) {
    CHECK(dynamic_cast<const RemoteError&>(e).worker() == "worker1");
  }
  // Every one is still a gw::Error (one virtual base, not two).
  CHECK_THROWS_AS(rpc_sync("worker1", fail_with, std::string("bad")), Error);
}

TEST_CASE("a response on another connection cannot complete a pending call", "[rpc][process]") {
  arm_blocked();
  Group g(3);
  Agent::Use use(g[0]);
  Future<int64_t> pending = rpc_async<int64_t>("worker1", block_until_released);
  // Another process of the job (it proves the key: here, none) connects as worker2 and answers
  // every call id worker0 has used so far (ids count from 1) with -666, on its own connection.
  const std::string address = g.store->get_string("rpc/worker/0");  // "name\nhost\nport"
  const auto nl1 = address.find('\n'), nl2 = address.rfind('\n');
  const int rc = gw::test::wait_exit(
      gw::test::spawn({GW_RPC_PROBE, "member", address.substr(nl1 + 1, nl2 - nl1 - 1),
                       address.substr(nl2 + 1), "worker0", "0", "worker2", "2", "-", "1", "64"}));
  REQUIRE(rc == 0);  // it was served min(1, 2), so its forged responses were all read
  CHECK(g[0].num_stray_responses() >= 1);
  CHECK_FALSE(pending.done());
  release_blocked();
  CHECK(pending.wait(10s) == 42);  // worker1's real answer
}

TEST_CASE("unknown functions and mismatched arguments fail on the caller", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  CHECK_THROWS_WITH(rpc_sync("worker1", "no_such_function", 1),
                    Catch::Contains("unknown function 'no_such_function'"));
  CHECK_THROWS_WITH(
      rpc_sync("worker1", "my_add", ones({2}), std::string("x")),
      Catch::Contains("my_add(Tensor, Tensor) -> Tensor") && Catch::Contains("(Tensor, str)"));
  CHECK_THROWS_WITH(rpc_sync("worker1", "my_add", ones({2})), Catch::Contains("no overload"));
  // The result type the caller asked for is checked too.
  CHECK_THROWS_WITH(rpc_sync<std::string>("worker1", "min", 1, 2),
                    Catch::Contains("expected a result of type str, got int"));
  CHECK_THROWS_WITH(rpc_sync("nobody", "min", 1, 2), Catch::Contains("unknown worker 'nobody'"));
  CHECK_THROWS_WITH(rpc_sync(7, "min", 1, 2), Catch::Contains("unknown worker id 7"));
}

TEST_CASE("a function registered to run inline answers while every pool thread is busy", "[rpc]") {
  arm_blocked();
  RpcBackendOptions o = Group::small_options();
  o.num_worker_threads = 1;
  Group g(2, o);
  Agent::Use use(g[0]);
  // The callee's only pool thread waits; a call queued behind it would time out.
  auto blocked = rpc_async<int64_t>("worker1", "block_until_released", timeout(0ms));
  CHECK(rpc_sync<int64_t>("worker1", "twice", 21, timeout(10s)) == 42);
  CHECK(rpc_sync(1, twice, 5, timeout(10s)) == 10);
  CHECK(rpc_sync<int64_t>("worker1", "min", 7, 3, timeout(10s)) == 3);  // builtin, inline
  // It may not wait for calls of its own: their answers would come to the thread that runs it.
  CHECK_THROWS_AS(rpc_sync(1, call_from_inline, std::string("worker0"), timeout(10s)), StateError);
  CHECK_THROWS_WITH(rpc_sync(1, call_from_inline, std::string("worker0"), timeout(10s)),
                    Catch::Contains("registered to run inline"));
  // Sending is fine: worker0's bump runs (bump counts in this process, which both agents share).
  const int64_t bumped = bumps();
  CHECK(rpc_sync(1, bump_from_inline, std::string("worker0"), timeout(10s)) == 1);
  const auto until = std::chrono::steady_clock::now() + 10s;  // round trips, not a sleep
  while (bumps() == bumped && std::chrono::steady_clock::now() < until)
    rpc_sync<int64_t>(1, "min", 1, 2);
  CHECK(bumps() == bumped + 1);
  release_blocked();
  CHECK(blocked.wait() == 42);
  // A call that brings an RRef runs on the pool, where to_here() may wait, and the fork it
  // made is deleted once the function is done.
  {
    RRef<int64_t> mine(int64_t{7});
    CHECK(rpc_sync(1, rref_int_inline, mine, timeout(10s)) == 7);
  }
  for (int trip = 0; trip < 200 && g[0].num_owner_rrefs() != 0; ++trip) rpc_sync(1, whoami);
  CHECK(g[0].num_owner_rrefs() == 0);
  // Arguments no overload accepts fail from the pool, as for any function.
  CHECK_THROWS_WITH(rpc_sync<int64_t>("worker1", "twice", std::string("x"), timeout(10s)),
                    Catch::Contains("no overload of 'twice'"));
}

TEST_CASE("a call that runs past its timeout fails with TimeoutError", "[rpc]") {
  arm_blocked();
  Group g(2);
  Agent::Use use(g[0]);
  auto fut = rpc_async("worker1", block_until_released, timeout(100ms));
  CHECK_THROWS_AS(fut.wait(), TimeoutError);
  CHECK_THROWS_WITH(fut.wait(), Catch::Contains("timed out after 100 ms"));
  // The default timeout applies when none is given.
  g[0].set_rpc_timeout(50ms);
  CHECK_THROWS_AS(rpc_sync("worker1", block_until_released), TimeoutError);
  g[0].set_rpc_timeout(kDefaultRpcTimeout);
  release_blocked();  // let the blocked handlers finish so shutdown can drain
  CHECK(rpc_sync("worker1", block_until_released) == 42);
}

namespace {
// A loopback listener whose accept queue is full: Linux drops further SYNs, as a route that
// loses packets does, so a connect to it gets no answer until the kernel gives up (minutes).
struct SilentListener {
  int listener = -1, queued = -1;
  uint16_t port = 0;
  SilentListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(::listen(listener, 0) == 0);
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
    queued = ::socket(AF_INET, SOCK_STREAM, 0);  // fills the queue: it is never accepted
    REQUIRE(::connect(queued, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  }
  ~SilentListener() {
    ::close(queued);
    ::close(listener);
  }
  // Whether this kernel drops SYNs to a full queue (the default; not with
  // tcp_abort_on_overflow): a probe's connect is neither answered nor refused for 500 ms.
  bool drops_syns() const {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    const bool pending = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
                         errno == EINPROGRESS;
    pollfd answer{.fd = probe, .events = POLLOUT, .revents = 0};
    const bool unanswered = pending && ::poll(&answer, 1, 500) == 0;
    ::close(probe);
    return unanswered;
  }
  // Whether a socket of this machine is in SYN_SENT toward the listener (/proc/net/tcp: the
  // remote address as hex ip:port, then the state, 02 for SYN_SENT).
  bool being_connected_to() const {
    char remote[32];
    std::snprintf(remote, sizeof remote, "0100007F:%04X 02", port);
    std::ifstream tcp("/proc/net/tcp");
    for (std::string line; std::getline(tcp, line);)
      if (line.find(remote) != std::string::npos) return true;
    return false;
  }
  // Options whose rendezvous says worker `rank`, named "silent", listens here and has arrived
  // (what Agent::rendezvous writes).
  RpcBackendOptions options_as_rank(int rank) const {
    auto store = std::make_shared<gw::store::HashStore>();
    store->set("rpc/worker/" + std::to_string(rank), "silent\n127.0.0.1\n" + std::to_string(port));
    store->add("rpc/workers/arrived", 1);
    RpcBackendOptions o = Group::small_options();
    o.store = store;
    return o;
  }
};
}  // namespace

TEST_CASE("a call to a worker that never answers the connect fails within its timeout", "[rpc]") {
  SilentListener silent;
  if (!silent.drops_syns()) GW_SKIP("this kernel answers connects to a full accept queue");
  Agent a("worker0", 0, 2, silent.options_as_rank(1));
  Agent::Use use(a);
  const auto start = std::chrono::steady_clock::now();
  auto fut = rpc_async("silent", whoami, timeout(200ms));
  CHECK_THROWS_AS(fut.wait(), TimeoutError);
  // Neither the call nor its future may wait out the kernel's connect retries: the bound is
  // the timeout plus slack for a loaded machine, far below those minutes.
  CHECK(std::chrono::steady_clock::now() - start < 20s);

  // A second caller finds a first one still connecting: it waits for that connect only as
  // long as its own timeout allows.
  auto first = std::async(std::launch::async, [&] {
    Agent::Use also(a);
    return rpc_async("silent", whoami, timeout(3000ms));
  });
  const auto wait_start = std::chrono::steady_clock::now();
  while (!silent.being_connected_to()) {
    REQUIRE(std::chrono::steady_clock::now() - wait_start < 20s);
    std::this_thread::yield();
  }
  const auto second_start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(rpc_async("silent", whoami, timeout(200ms)).wait(), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - second_start < 2500ms);  // not the first's 3 s
  CHECK_THROWS_AS(first.get().wait(), TimeoutError);
  a.shutdown(/*graceful=*/false);
}

TEST_CASE("connecting to a silent worker blocks neither the caller nor the network thread",
          "[rpc]") {
  SilentListener silent;
  if (!silent.drops_syns()) GW_SKIP("this kernel answers connects to a full accept queue");
  const RpcBackendOptions o = silent.options_as_rank(2);
  auto second =
      std::async(std::launch::async, [&] { return std::make_unique<Agent>("worker1", 1, 3, o); });
  Agent a("worker0", 0, 3, o);
  std::unique_ptr<Agent> b = second.get();
  Agent::Use use(a);

  // The caller gets its future at once; the connect goes on without it.
  auto from_caller = rpc_async("silent", whoami, timeout(5000ms));
  CHECK_FALSE(from_caller.done());

  // A callback on the network thread (it runs where worker1's answer is read: the call is held
  // until the callback is attached) calls the silent worker too; answers from worker1 still
  // arrive meanwhile.
  arm_blocked();
  std::promise<Future<std::string>> made;
  auto held = rpc_async("worker1", block_until_released, timeout(0ms));
  held.add_done_callback([&](Future<int64_t>&) {
    try {
      made.set_value(rpc_async("silent", whoami, timeout(5000ms)));
    } catch (...) {
      made.set_exception(std::current_exception());
    }
  });
  release_blocked();
  Future<std::string> from_network_thread = made.get_future().get();
  CHECK(rpc_sync("worker1", whoami) == "worker1");
  CHECK_FALSE(from_network_thread.done());
  CHECK_FALSE(from_caller.done());
  a.shutdown(/*graceful=*/false);
  b->shutdown(/*graceful=*/false);
  CHECK_THROWS_AS(from_caller.wait(), StateError);
  CHECK_THROWS_AS(from_network_thread.wait(), StateError);
}

TEST_CASE("async execution chains calls across three workers without blocking a thread", "[rpc]") {
  RpcBackendOptions options = Group::small_options();
  options.num_worker_threads = 1;  // a blocking implementation would deadlock here
  Group g(3, options);
  Agent::Use use(g[0]);
  Tensor ret = rpc_sync("worker1", async_add_chained, std::string("worker2"), ones({2}), 1, 1);
  CHECK(ret.to_vector<float>() == std::vector<float>{3.f, 3.f});
  // Nested on the same single-threaded worker: worker1 calls itself.
  ret = rpc_sync("worker1", async_add_chained, std::string("worker1"), ones({2}), 1, 2);
  CHECK(ret.to_vector<float>() == std::vector<float>{4.f, 4.f});
}

TEST_CASE("graceful shutdown waits for calls in flight", "[rpc]") {
  arm_blocked();
  Group g(2);
  Future<int64_t> fut;
  {
    Agent::Use use(g[0]);
    fut = rpc_async("worker1", block_until_released, timeout(0ms));
  }
  auto shutting = std::async(std::launch::async, [&] { g.shutdown(); });
  CHECK(shutting.wait_for(0ms) != std::future_status::ready);
  release_blocked();
  shutting.get();
  CHECK(fut.done());
  CHECK(fut.value() == 42);
}

TEST_CASE("non-graceful shutdown fails the calls still pending", "[rpc]") {
  arm_blocked();
  Group g(2);
  Agent::Use use(g[0]);
  auto fut = rpc_async("worker1", block_until_released, timeout(0ms));
  g[0].shutdown(false);
  CHECK_THROWS_AS(fut.wait(), StateError);
  CHECK_THROWS_WITH(rpc_sync("worker1", whoami), Catch::Contains("shut down"));
  release_blocked();
  g[1].shutdown(false);
}

TEST_CASE("a local shutdown waits for async handlers to unwind before the agent goes", "[rpc]") {
  arm_blocked();
  Group g(3);
  Future<int64_t> fut;
  {
    Agent::Use use(g[0]);
    fut = rpc_async("worker1", async_wait_on, std::string("worker2"), timeout(0ms));
    CHECK(rpc_sync("worker1", whoami) == "worker1");  // worker1 is serving
  }
  g[1].shutdown(false);  // fails worker1's call to worker2, so the handler's chain unwinds
  g.agents[1].reset();   // destroying the agent must be safe now (ASan checks)
  CHECK_THROWS_AS(fut.wait(), Error);
  release_blocked();
  g[0].shutdown(false);  // worker1 is gone: a graceful shutdown would wait for it
  g[2].shutdown(false);
  g.agents.clear();
}

TEST_CASE("an agent cannot be shut down from its own handler", "[rpc]") {
  Group g(2);
  Agent::Use use(g[0]);
  CHECK_THAT(rpc_sync(1, shutdown_from_handler), Catch::Contains("from one of its own threads"));
  CHECK(rpc_sync(1, whoami) == "worker1");  // still serving
}

TEST_CASE("init_rpc rejects bad names, ranks and duplicate names", "[rpc]") {
  auto store = std::make_shared<gw::store::HashStore>(std::chrono::milliseconds(200));
  RpcBackendOptions o;
  o.store = store;
  CHECK_THROWS_WITH(Agent("bad name!", 0, 1, o), Catch::Contains("worker name 'bad name!'"));
  CHECK_THROWS_WITH(Agent(std::string(128, 'a'), 0, 1, o), Catch::Contains("1-127 characters"));
  CHECK_THROWS_WITH(Agent("w", 2, 2, o), Catch::Contains("rank 2 is outside"));
  CHECK_THROWS_AS(Agent("alone", 0, 2, o), TimeoutError);  // rank 1 never shows up
  Group g(1);
  CHECK(g[0].get_worker_info() == WorkerInfo{"worker0", 0});
}
