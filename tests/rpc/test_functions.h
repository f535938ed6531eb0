// Functions the RPC tests call remotely. They are registered on every worker because the test
// binary and the peer-process binary (rpc_peer) both link test_functions.cpp.
#pragma once

#include "rpc/rpc.h"

namespace gw::rpc::testing {

Tensor my_add(Tensor a, Tensor b);
// Throws InvalidArgumentError with `message`.
Tensor fail_with(std::string message);
// Throws `kind` ("timeout": TimeoutError, "state": StateError, else std::runtime_error).
int64_t fail_as(std::string kind, std::string message);
// Blocks until release_blocked() is called in this process; arm_blocked() re-arms it.
int64_t block_until_released();
void release_blocked();
void arm_blocked();
// The spec's async_add_chained: runs add(x, y) on `to` with async execution, then adds z.
Future<Tensor> async_add_chained(std::string to, Tensor x, int64_t y, int64_t z);
// Async: waits for block_until_released on `to`.
Future<int64_t> async_wait_on(std::string to);
// Kills this process at once, as a crash would.
int64_t crash();
std::string whoami();
// Registered to run inline, on the thread that read the request: returns 2 * x.
int64_t twice(int64_t x);
// Registered to run inline: rpc_sync to `to`, whose wait an inline function may not do.
int64_t call_from_inline(std::string to);
// Registered to run inline: calls bump on `to` without waiting for it (rpc_async); returns 1.
int64_t bump_from_inline(std::string to);
// Registered to run inline: r's value, where it is owned (a call with an RRef runs on the pool).
int64_t rref_int_inline(RRef<int64_t> r);
// Computes (spins, holding its worker thread) for `ms` milliseconds; returns `ms`.
int64_t busy_for_ms(int64_t ms);
// A side effect the security tests watch: how often bump() ran in this process.
int64_t bump();
int64_t bumps();
// Calls bump on `to`, sends it `n` more without waiting, and exits this process at once.
int64_t bump_then_exit(std::string to, int64_t n);
// Tries to shut the agent down from its own handler; returns the error it got.
std::string shutdown_from_handler();

// RRefs received by a worker.
Tensor rref_sum(RRef<Tensor> r);    // r.to_here().sum(), on the receiving worker
int64_t rref_int(RRef<int64_t> r);  // r.to_here()
void keep_rref(RRef<Tensor> r);     // holds r until drop_kept_rrefs()
void drop_kept_rrefs();
// Blocks until release_blocked(), then passes `r` to worker `to`, which keeps it (keep_rref).
int64_t pass_rref_when_released(std::string to, RRef<Tensor> r);
RRef<Tensor> make_local_rref(Tensor t);  // an RRef owned by the worker running this
// Async: answers with an RRef to `t`, owned by the worker running it, when answer_held_rref()
// is called in this process (with that worker as the current agent).
Future<RRef<Tensor>> held_rref(Tensor t);
void answer_held_rref();

// A user type sent through gw::rpc::Serializer.
struct Point {
  double x = 0, y = 0;
};
// Exercises the argument kinds: optional, pair, user type, vector of tensors; returns a tuple.
std::tuple<int64_t, std::string, Point, std::vector<Tensor>> kinds(
    std::optional<int64_t> maybe, std::pair<double, std::string> pair, Point p,
    std::vector<Tensor> ts);

// A class whose objects live on RRef owners (registered as "Counter").
struct Counter {
  int64_t n = 0;
  int64_t add(int64_t k) { return n += k; }
  int64_t get() const { return n; }
};

}  // namespace gw::rpc::testing

template <>
struct gw::rpc::Serializer<gw::rpc::testing::Point> {
  static std::vector<uint8_t> serialize(const gw::rpc::testing::Point& p);
  static gw::rpc::testing::Point deserialize(std::span<const uint8_t> bytes);
};
