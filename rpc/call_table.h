// gw::rpc::CallTable — the calls a worker is waiting on: each one's future, the worker its
// request went to, the connection that request was written to, and its deadline.
//
// Mental model: a call is added before its request is sent, bound to a connection just before
// the request is written to it, and taken out exactly once, by whichever comes first: its
// response (only from the connection it is bound to), its deadline (one timer, armed for the
// earliest), the loss of its connection, a failure to send, or close() at shutdown. Whoever
// takes it completes its future, outside the table's lock. A response claims its call on the
// network thread, as it arrives, and may answer it later from another thread (after its CUDA
// tensors were placed): claimed, the call no longer times out or fails with its connection,
// but wait_empty() still waits for it.
//
//   Future<IValue> f = calls.add(id, peer, "call of 'f'", 50ms);
//   calls.bind(id, conn);                            // the request is about to go out on conn
//   Future<IValue> claimed;                          // ... its response arrives on `from`:
//   if (calls.claim(id, from, claimed) == CallTable::Match::kPending) calls.answer(claimed, r);
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "core/future.h"
#include "rpc/ivalue.h"
#include "rpc/protocol.h"

namespace gw::rpc {

class Connection;

class CallTable {
 public:
  using Clock = std::chrono::steady_clock;

  // The deadline timer runs on `io`'s thread; error messages name workers by `worker_names`,
  // and the flight recorder (debug/flight_recorder.h) records each call under `self`.
  CallTable(asio::io_context& io, std::vector<std::string> worker_names, std::string self);
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;

  // Registers call `id` to worker `peer`, described by `what` ("call of 'f'"); it fails with
  // TimeoutError after `timeout` (0: never). Throws StateError after close().
  Future<IValue> add(uint64_t id, int peer, std::string what, std::chrono::milliseconds timeout);
  // The request of call `id` is about to be written to `conn`: only `conn` may answer it, and
  // its loss fails the call.
  void bind(uint64_t id, const Connection* conn);

  // What a response to `id` arriving on `from` finds. kPending: the call was bound to `from`; it
  // is taken out into `claimed`, which answer() must complete.
  enum class Match { kPending, kOtherConnection, kNotPending };
  Match claim(uint64_t id, const Connection* from, Future<IValue>& claimed);
  // Completes a claimed call with `r`: its value, or the callee's failure as its own type.
  void answer(Future<IValue>& claimed, Response& r);
  // Fails call `id` with `e` if it is still pending.
  void fail(uint64_t id, std::exception_ptr e);
  // Fails every call bound to `conn` with IoError: the connection was lost because of `why`.
  void fail_on(const Connection* conn, const std::string& why);
  // Fails every call with StateError(why) and refuses new ones.
  void close(const std::string& why);

  // Blocks until no call is pending or claimed and unanswered, or until `deadline`; false then.
  bool wait_empty(Clock::time_point deadline = Clock::time_point::max());

  // The calls pending now, oldest first, for get_debug_info().
  struct PendingCall {
    uint64_t id;
    int peer;
    std::string what;
    double age_ms;
  };
  std::vector<PendingCall> pending_calls() const;

 private:
  struct Pending {
    Future<IValue> future;
    int peer = -1;
    std::string what;
    std::chrono::milliseconds timeout{0};
    Clock::time_point sent;
    const Connection* conn = nullptr;
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
  };
  // Caller holds mu_. Removes call `it` and its deadline, counting it in taken_ until settled()
  // after its future was completed. The timer may stay armed for a deadline that is gone: it
  // then fires, finds nothing due, and re-arms.
  Pending take_locked(std::unordered_map<uint64_t, Pending>::iterator it);
  // `n` calls taken out were completed: wakes wait_empty() if nothing is left.
  void settled(size_t n);
  // Fails `p` with E("[rpc] <what> on worker '<peer>' <happened>").
  template <typename E>
  void fail_with(Pending& p, const std::string& happened);
  static void fail_quietly(Future<IValue>& f, std::exception_ptr e);
  void arm_timer();  // network thread
  void expire_due();

  asio::io_context& io_;
  const std::vector<std::string> names_;
  const std::string self_;
  mutable std::mutex mu_;
  std::condition_variable empty_;
  bool closed_ = false;
  std::unordered_map<uint64_t, Pending> pending_;
  size_t taken_ = 0;  // taken out, future not yet completed (wait_empty waits for them too)
  // Deadlines of the calls that have one, and the one timer that fires at the earliest. A new
  // call touches the timer only if its deadline is the new earliest, which keeps timer syscalls
  // and network-thread wake-ups off the common path.
  std::multimap<Clock::time_point, uint64_t> deadlines_;
  Clock::time_point armed_for_ = Clock::time_point::max();
  asio::steady_timer timer_;
};

}  // namespace gw::rpc
