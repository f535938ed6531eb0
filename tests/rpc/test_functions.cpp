#include "tests/rpc/test_functions.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/ops.h"

namespace gw::rpc::testing {

namespace {
std::mutex g_mu;
std::condition_variable g_cv;
bool g_released = false;
}  // namespace

Tensor my_add(Tensor a, Tensor b) { return a + b; }

Tensor fail_with(std::string message) { throw InvalidArgumentError(message); }

int64_t fail_as(std::string kind, std::string message) {
  if (kind == "timeout") throw TimeoutError(message);
  if (kind == "state") throw StateError(message);
  if (kind == "int") throw 42;  // not an exception class at all
  throw std::runtime_error(message);
}

int64_t block_until_released() {
  std::unique_lock lock(g_mu);
  g_cv.wait(lock, [] { return g_released; });
  return 42;
}

void release_blocked() {
  {
    std::lock_guard lock(g_mu);
    g_released = true;
  }
  g_cv.notify_all();
}

void arm_blocked() {
  std::lock_guard lock(g_mu);
  g_released = false;
}

Future<Tensor> async_add_chained(std::string to, Tensor x, int64_t y, int64_t z) {
  return rpc_async<Tensor>(to, "add", x, y).then([z](Future<Tensor>& f) { return f.wait() + z; });
}

Future<int64_t> async_wait_on(std::string to) {
  return rpc_async<int64_t>(to, "block_until_released", timeout(std::chrono::milliseconds(0)));
}

int64_t crash() { std::_Exit(3); }

std::string whoami() { return current_agent().get_worker_info().name; }

int64_t twice(int64_t x) { return 2 * x; }
int64_t call_from_inline(std::string to) { return rpc_sync<int64_t>(to, "min", 1, 2); }
int64_t rref_int_inline(RRef<int64_t> r) { return r.to_here(); }
int64_t bump_from_inline(std::string to) {
  rpc_async<int64_t>(to, "bump");
  return 1;
}

int64_t busy_for_ms(int64_t ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile uint64_t spins = 0;
  while (std::chrono::steady_clock::now() < until) spins = spins + 1;  // bounded by `until`
  return ms;
}

namespace {
std::atomic<int64_t> g_bumps{0};
}
int64_t bump() { return ++g_bumps; }
int64_t bumps() { return g_bumps.load(); }

int64_t bump_then_exit(std::string to, int64_t n) {
  rpc_sync<int64_t>(to, "bump");  // the connection to `to` is open (and switched, if it can)
  for (int64_t i = 0; i < n; ++i) rpc_async<int64_t>(to, "bump");  // written, unanswered
  std::_Exit(0);
}

std::string shutdown_from_handler() {
  try {
    current_agent().shutdown(false);
  } catch (const StateError& e) {
    return e.what();
  }
  return "no error";
}
namespace {
std::optional<std::pair<Future<RRef<Tensor>>, Tensor>> g_held;  // guarded by g_mu
}  // namespace

Future<RRef<Tensor>> held_rref(Tensor t) {
  Future<RRef<Tensor>> answer;
  {
    std::lock_guard lock(g_mu);
    g_held.emplace(answer, t);
  }
  g_cv.notify_all();
  return answer;
}

void answer_held_rref() {
  std::unique_lock lock(g_mu);
  if (!g_cv.wait_for(lock, std::chrono::seconds(10), [] { return g_held.has_value(); }))
    throw TimeoutError("answer_held_rref: held_rref was never called");
  auto [answer, t] = std::move(*g_held);
  g_held.reset();
  lock.unlock();
  answer.set_result(RRef<Tensor>(t));
}

GW_RPC_FUNCTION(shutdown_from_handler);

namespace {
std::mutex g_kept_mu;
std::vector<RRef<Tensor>> g_kept;
}  // namespace

Tensor rref_sum(RRef<Tensor> r) { return r.to_here().sum(); }
int64_t rref_int(RRef<int64_t> r) { return r.to_here(); }
void keep_rref(RRef<Tensor> r) {
  std::lock_guard lock(g_kept_mu);
  g_kept.push_back(std::move(r));
}
void drop_kept_rrefs() {
  std::vector<RRef<Tensor>> dropped;
  std::lock_guard lock(g_kept_mu);
  dropped.swap(g_kept);
}

int64_t pass_rref_when_released(std::string to, RRef<Tensor> r) {
  block_until_released();
  rpc_sync(to, keep_rref, r);
  return 42;
}
RRef<Tensor> make_local_rref(Tensor t) { return RRef<Tensor>(t); }

std::tuple<int64_t, std::string, Point, std::vector<Tensor>> kinds(
    std::optional<int64_t> maybe, std::pair<double, std::string> pair, Point p,
    std::vector<Tensor> ts) {
  Point swapped{p.y, p.x};
  return {maybe.value_or(-1),
          pair.second + std::to_string(static_cast<int>(pair.first)),
          swapped,
          {gw::cat(ts)}};
}
GW_RPC_FUNCTION(kinds);

GW_RPC_FUNCTION(rref_sum);
GW_RPC_FUNCTION(rref_int);
GW_RPC_FUNCTION(keep_rref);
GW_RPC_FUNCTION(drop_kept_rrefs);
GW_RPC_FUNCTION(make_local_rref);

namespace {
const bool kCounterRegistered = [] {
  functions()
      .add_class<Counter>("Counter")
      .add_method("add", &Counter::add)
      .add_method("get", &Counter::get);
  functions().add("make_counter", [](int64_t start) {
    auto c = std::make_shared<Counter>();
    c->n = start;
    return c;
  });
  functions().add_constructor<Counter>("Counter");
  return true;
}();
}  // namespace

GW_RPC_FUNCTION(my_add);
GW_RPC_FUNCTION(fail_with);
GW_RPC_FUNCTION(fail_as);
GW_RPC_FUNCTION(held_rref);
GW_RPC_FUNCTION(block_until_released);
GW_RPC_FUNCTION(async_add_chained);
GW_RPC_FUNCTION(crash);
GW_RPC_FUNCTION(async_wait_on);
GW_RPC_FUNCTION(whoami);
GW_RPC_FUNCTION(busy_for_ms);
GW_RPC_INLINE_FUNCTION(twice);
GW_RPC_INLINE_FUNCTION(call_from_inline);
GW_RPC_INLINE_FUNCTION(rref_int_inline);
GW_RPC_INLINE_FUNCTION(bump_from_inline);
GW_RPC_FUNCTION(bump_then_exit);
GW_RPC_FUNCTION(pass_rref_when_released);
GW_RPC_FUNCTION(bump);

}  // namespace gw::rpc::testing

std::vector<uint8_t> gw::rpc::Serializer<gw::rpc::testing::Point>::serialize(
    const gw::rpc::testing::Point& p) {
  std::vector<uint8_t> b(sizeof(double) * 2);
  std::memcpy(b.data(), &p.x, sizeof(double));
  std::memcpy(b.data() + sizeof(double), &p.y, sizeof(double));
  return b;
}

gw::rpc::testing::Point gw::rpc::Serializer<gw::rpc::testing::Point>::deserialize(
    std::span<const uint8_t> bytes) {
  GW_CHECK(bytes.size() == 2 * sizeof(double), InvalidArgumentError,
           "[Point] expected 16 bytes, got ", bytes.size());
  gw::rpc::testing::Point p;
  std::memcpy(&p.x, bytes.data(), sizeof(double));
  std::memcpy(&p.y, bytes.data() + sizeof(double), sizeof(double));
  return p;
}
