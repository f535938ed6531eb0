// gw::dist::Work — the handle of a collective in flight (c10d's Work).
//
// Every collective returns at once with a Work; wait() blocks until it finished on this rank
// and rethrows its error (gw::IoError when a peer died, gw::TimeoutError when it timed out).
// Tensors given to a collective must not be touched until then.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/future.h"
#include "debug/flight_recorder.h"

namespace gw::dist {

namespace detail {
// Set while a process group's own thread runs a collective or its callbacks: waiting for another
// collective there would wait for itself.
inline thread_local bool t_on_group_thread = false;
struct GroupThreadScope {
  GroupThreadScope() { t_on_group_thread = true; }
  ~GroupThreadScope() { t_on_group_thread = false; }
};
}  // namespace detail

class Work {
 public:
  // What a Work's driver is asked (set_driver).
  enum class Drive {
    kRunInline,  // wait(): run the collective here if it has not started
    kLaunch,     // future(), wait(timeout), is_completed(): start it now, elsewhere
  };
  // How wait() may run the collective itself when it has not started yet (a collective waited
  // for at once then costs no hand-off to the group's thread and back), and how future(),
  // wait(timeout) and is_completed() ask the group to start it now rather than leave it for a
  // wait() (collective_queue.h). It is given the Work, so that it need not hold it.
  class Driver {
   public:
    virtual ~Driver() = default;
    virtual void drive(const Work* work, Drive drive) = 0;
  };
  // A driver that calls `f(work, drive)`: a transfer's own.
  template <typename F>
  static std::shared_ptr<Driver> driver_of(F f) {
    struct Of final : Driver {
      F f;
      explicit Of(F f) : f(std::move(f)) {}
      void drive(const Work* work, Drive drive) override { f(work, drive); }
    };
    return std::make_shared<Of>(std::move(f));
  }

  explicit Work(std::string op) : op_(std::move(op)) {}

  // Throws what the collective raised. With a timeout: TimeoutError if it is still running
  // then (the collective itself goes on and fails by its own timeout).
  void wait() const {
    check_not_on_group_thread();
    if (!finished()) {
      if (driver_) driver_->drive(this, Drive::kRunInline);
      if (!finished()) completion().wait();
    }
    if (error_) std::rethrow_exception(error_);
  }
  void wait(std::chrono::milliseconds timeout) const {
    check_not_on_group_thread();
    ask_launch();
    try {
      completion().wait(timeout);
    } catch (const TimeoutError&) {
      if (finished()) throw;  // the collective's own timeout
      debug::request_dump("wait for " + op_ + " timed out");
      throw TimeoutError(gw::detail::str("[", op_, "] not completed within ", timeout.count(),
                                         " ms (it keeps running)"));
    }
  }
  // Polling is asynchronous use too: a collective (or a send or receive) not started yet is
  // started now, so that it completes without a wait().
  bool is_completed() const {
    ask_launch();
    return finished();
  }
  bool is_success() const { return finished() && !error_; }
  std::exception_ptr exception() const { return finished() ? error_ : nullptr; }
  const std::string& op() const { return op_; }

  // Chaining on the future is asynchronous use: a collective not started yet starts now.
  Future<void>& future() {
    ask_launch();
    return completion();
  }
  // Completes it with `failure` (null: success) unless it was completed already — by a group
  // failing everything pending at once (a rank declared dead) while the collective still runs.
  // Thread-safe; returns whether this call completed it.
  bool finish(std::exception_ptr failure) {
    if (flags_.fetch_or(kClaimed, std::memory_order_acq_rel) & kClaimed) return false;
    try {
      if (recorded_) {
        debug::finish(record_, failure);
        if (failure)
          debug::request_dump(op_ + " #" + std::to_string(seq_) + " failed on " + group_);
      }
      if (on_finish_) on_finish_(failure);
    } catch (...) {  // a record lost, not the collective's outcome
    }
    error_ = failure;
    // The caller holds the Work: a waiter that sees kFinished may drop its own reference.
    if ((flags_.fetch_or(kFinished, std::memory_order_acq_rel) & kHasFuture) && claim_future())
      complete_future(failure);
    return true;
  }
  // Its event `record` in the flight recorder (0: the recorder is off), the collective number
  // `seq` in `group`: finish() completes the event, and on a failure asks for a dump naming it
  // ("allreduce #3 failed on default_pg"), before any waiter wakes. Set before it can finish.
  void set_record(uint64_t record, int64_t seq, std::string group) {
    recorded_ = true;
    record_ = record;
    seq_ = seq;
    group_ = std::move(group);
  }
  // Runs in finish(), after the record and before the Work completes, so that what it records
  // (the timeline) is done before any waiter wakes. Set before the Work can finish.
  void set_on_finish(std::function<void(const std::exception_ptr&)> f) {
    on_finish_ = std::move(f);
  }
  // Set before the Work is handed out.
  void set_driver(std::shared_ptr<Driver> driver) { driver_ = std::move(driver); }

 private:
  // Most collectives are waited for at once, and run inline: their Work completes with two
  // atomic operations and no Future (a Future is an allocation, a lock and a condition
  // variable). One is made when someone must block, or asks for it (future(), wait(timeout)).
  static constexpr uint32_t kClaimed = 1;     // finish() was called
  static constexpr uint32_t kFinished = 2;    // error_ is set: the Work is complete
  static constexpr uint32_t kHasFuture = 4;   // future_ is made
  static constexpr uint32_t kFutureDone = 8;  // claimed by whoever completes future_

  bool finished() const { return (flags_.load(std::memory_order_acquire) & kFinished) != 0; }

  // The Future that completes with the Work, made on first use. Once the Work is finished,
  // whoever sees both kFinished and kHasFuture first completes it — finish(), or this, so that
  // a Work seen complete never hands out a Future that is not. Completed outside the lock: its
  // callbacks may ask for it again.
  Future<void>& completion() const {
    uint32_t flags;
    {
      std::lock_guard lock(future_mu_);
      if (!future_) {
        future_.emplace();
        flags = flags_.fetch_or(kHasFuture, std::memory_order_acq_rel) | kHasFuture;
      } else {
        flags = flags_.load(std::memory_order_acquire);
      }
    }
    if (flags & kFinished) {
      if (claim_future())
        complete_future(error_);
      else  // finish() claimed it and completes it now: a few instructions away
        while (!future_->done()) std::this_thread::yield();
    }
    return *future_;
  }
  bool claim_future() const {
    return (flags_.fetch_or(kFutureDone, std::memory_order_acq_rel) & kFutureDone) == 0;
  }
  void complete_future(const std::exception_ptr& failure) const {
    Future<void> f = *future_;  // never reset once made
    if (failure)
      f.set_exception(failure);
    else
      f.set_result();
  }

  void check_not_on_group_thread() const {
    GW_CHECK(finished() || !detail::t_on_group_thread, StateError, "[", op_,
             "] Work::wait on a process group's own thread (in a callback or communication "
             "hook) would wait for itself; chain on future() instead");
  }

  void ask_launch() const {
    if (driver_ && !finished() && !launch_asked_.exchange(true))
      driver_->drive(this, Drive::kLaunch);
  }

  std::string op_;
  mutable std::atomic<uint32_t> flags_{0};
  std::exception_ptr error_;  // written once, before kFinished; read after it
  mutable std::mutex future_mu_;
  mutable std::optional<Future<void>> future_;  // never reset once made
  mutable std::atomic<bool> launch_asked_{false};
  std::shared_ptr<Driver> driver_;
  std::function<void(const std::exception_ptr&)> on_finish_;
  bool recorded_ = false;  // set_record()
  uint64_t record_ = 0;
  int64_t seq_ = -1;
  std::string group_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace gw::dist
