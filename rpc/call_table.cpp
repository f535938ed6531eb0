#include "rpc/call_table.h"

#include <algorithm>

#include "core/log.h"
#include "debug/flight_recorder.h"

namespace gw::rpc {

CallTable::CallTable(asio::io_context& io, std::vector<std::string> worker_names, std::string self)
    : io_(io), names_(std::move(worker_names)), self_(std::move(self)), timer_(io) {}

Future<IValue> CallTable::add(uint64_t id, int peer, std::string what,
                              std::chrono::milliseconds timeout) {
  Future<IValue> future;
  std::lock_guard lock(mu_);
  GW_CHECK(!closed_, StateError, "[rpc] cannot send the ", what, " to worker '", names_[peer],
           "': this RPC agent is shut down");
  const uint64_t record = debug::record({.kind = debug::Kind::kRpcCall,
                                         .group = self_,
                                         .seq = static_cast<int64_t>(id),
                                         .op = what,
                                         .detail = names_[peer],
                                         .peer = peer});
  debug::finish_when_done(record, future);
  Pending& p = pending_[id];
  p.future = future;
  p.peer = peer;
  p.what = std::move(what);
  p.timeout = timeout;
  p.sent = Clock::now();
  p.deadline = deadlines_.end();
  if (timeout.count() > 0) {
    const auto when = Clock::now() + timeout;
    p.deadline = deadlines_.emplace(when, id);
    if (when < armed_for_) {
      armed_for_ = when;
      asio::post(io_, [this] { arm_timer(); });
    }
  }
  return future;
}

void CallTable::bind(uint64_t id, const Connection* conn) {
  std::lock_guard lock(mu_);
  if (auto it = pending_.find(id); it != pending_.end()) it->second.conn = conn;
}

CallTable::Match CallTable::claim(uint64_t id, const Connection* from, Future<IValue>& claimed) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return Match::kNotPending;
  if (it->second.conn != from) return Match::kOtherConnection;
  claimed = take_locked(it).future;
  return Match::kPending;
}

void CallTable::answer(Future<IValue>& claimed, Response& r) {
  try {
    if (r.error)
      claimed.set_exception(remote_failure(r.error->code, r.error->worker, r.error->message));
    else
      claimed.set_result(std::move(r.value));
  } catch (const std::exception& e) {  // e.g. the caller completed the future itself
    log_error("[rpc] an answer could not complete its call: ", e.what());
  }
  settled(1);
}

void CallTable::settled(size_t n) {
  std::lock_guard lock(mu_);
  taken_ -= n;
  if (taken_ == 0 && pending_.empty()) empty_.notify_all();
}

CallTable::Pending CallTable::take_locked(std::unordered_map<uint64_t, Pending>::iterator it) {
  Pending p = std::move(it->second);
  pending_.erase(it);
  ++taken_;
  if (p.deadline != deadlines_.end()) deadlines_.erase(p.deadline);
  return p;
}

template <typename E>
void CallTable::fail_with(Pending& p, const std::string& happened) {
  fail_quietly(p.future, std::make_exception_ptr(E(gw::detail::str(
                             "[rpc] ", p.what, " on worker '", names_[p.peer], "' ", happened))));
}

void CallTable::fail_quietly(Future<IValue>& f, std::exception_ptr e) {
  try {
    f.set_exception(std::move(e));
  } catch (const std::exception& err) {  // e.g. the caller completed the future itself
    log_error("[rpc] a call could not be failed: ", err.what());
  }
}

void CallTable::fail(uint64_t id, std::exception_ptr e) {
  Pending p;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    p = take_locked(it);
  }
  fail_quietly(p.future, std::move(e));
  settled(1);
}

void CallTable::fail_on(const Connection* conn, const std::string& why) {
  std::vector<Pending> lost;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto next = std::next(it);
      if (it->second.conn == conn) lost.push_back(take_locked(it));
      it = next;
    }
  }
  for (auto& p : lost) fail_with<IoError>(p, "failed: connection lost (" + why + ")");
  settled(lost.size());
}

void CallTable::close(const std::string& why) {
  std::unordered_map<uint64_t, Pending> left;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    left.swap(pending_);
    deadlines_.clear();
    taken_ += left.size();
  }
  for (auto& [id, p] : left) fail_with<StateError>(p, "failed: " + why);
  settled(left.size());
  // After the deadlines are gone: the timer, if armed, is cancelled and not armed again.
  asio::post(io_, [this] { arm_timer(); });
}

bool CallTable::wait_empty(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  auto empty = [&] { return pending_.empty() && taken_ == 0; };
  if (deadline == Clock::time_point::max()) {
    empty_.wait(lock, empty);
    return true;
  }
  return empty_.wait_until(lock, deadline, empty);
}

std::vector<CallTable::PendingCall> CallTable::pending_calls() const {
  std::vector<PendingCall> out;
  const auto now = Clock::now();
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, p] : pending_)
      out.push_back(
          {id, p.peer, p.what, std::chrono::duration<double, std::milli>(now - p.sent).count()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

// Network thread: points the timer at the earliest deadline.
void CallTable::arm_timer() {
  std::lock_guard lock(mu_);
  if (deadlines_.empty()) {
    armed_for_ = Clock::time_point::max();
    timer_.cancel();
    return;
  }
  armed_for_ = deadlines_.begin()->first;
  timer_.expires_at(armed_for_);
  timer_.async_wait([this](const std::error_code& ec) {
    if (!ec) expire_due();
  });
}

// Network thread: fails every call whose deadline has passed, then re-arms.
void CallTable::expire_due() {
  std::vector<Pending> expired;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now)
      expired.push_back(take_locked(pending_.find(deadlines_.begin()->second)));
  }
  for (auto& p : expired)
    fail_with<TimeoutError>(p, gw::detail::str("timed out after ", p.timeout.count(), " ms"));
  if (!expired.empty()) debug::request_dump("an RPC on " + self_ + " timed out");
  settled(expired.size());
  arm_timer();
}

}  // namespace gw::rpc
