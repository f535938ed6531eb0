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
#include <string>

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
  using Driver = std::function<void(const Work*, Drive)>;

  explicit Work(std::string op) : op_(std::move(op)) {}

  // Throws what the collective raised. With a timeout: TimeoutError if it is still running
  // then (the collective itself goes on and fails by its own timeout).
  void wait() const {
    check_not_on_group_thread();
    if (driver_ && !done_.done()) (*driver_)(this, Drive::kRunInline);
    done_.wait();
  }
  void wait(std::chrono::milliseconds timeout) const {
    check_not_on_group_thread();
    ask_launch();
    try {
      done_.wait(timeout);
    } catch (const TimeoutError&) {
      if (done_.done()) throw;  // the collective's own timeout
      debug::request_dump("wait for " + op_ + " timed out");
      throw TimeoutError(gw::detail::str("[", op_, "] not completed within ", timeout.count(),
                                         " ms (it keeps running)"));
    }
  }
  // Polling is asynchronous use too: a collective (or a send or receive) not started yet is
  // started now, so that it completes without a wait().
  bool is_completed() const {
    ask_launch();
    return done_.done();
  }
  bool is_success() const { return done_.done() && !done_.has_error(); }
  std::exception_ptr exception() const { return done_.exception(); }
  const std::string& op() const { return op_; }

  // Chaining on the future is asynchronous use: a collective not started yet starts now.
  Future<void>& future() {
    ask_launch();
    return done_;
  }
  // Completes it with `failure` (null: success) unless it was completed already — by a group
  // failing everything pending at once (a rank declared dead) while the collective still runs.
  // Thread-safe; returns whether this call completed it.
  bool finish(std::exception_ptr failure) {
    if (finished_.exchange(true)) return false;
    try {
      if (recorded_) {
        debug::finish(record_, failure);
        if (failure)
          debug::request_dump(op_ + " #" + std::to_string(seq_) + " failed on " + group_);
      }
      if (on_finish_) on_finish_(failure);
    } catch (...) {  // a record lost, not the collective's outcome
    }
    if (failure)
      done_.set_exception(std::move(failure));
    else
      done_.set_result();
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
  // How wait() may run the collective itself when it has not started yet (a collective waited
  // for at once then costs no hand-off to the group's thread and back), and how future(),
  // wait(timeout) and is_completed() ask the group to start it now rather than leave it for a
  // wait() (collective_queue.h). It is given the Work, so that it need not hold it; a group's
  // Works share one (nothing is allocated per collective).
  void set_driver(std::shared_ptr<const Driver> driver) { driver_ = std::move(driver); }

 private:
  void check_not_on_group_thread() const {
    GW_CHECK(done_.done() || !detail::t_on_group_thread, StateError, "[", op_,
             "] Work::wait on a process group's own thread (in a callback or communication "
             "hook) would wait for itself; chain on future() instead");
  }

  void ask_launch() const {
    if (driver_ && !done_.done() && !launch_asked_.exchange(true)) (*driver_)(this, Drive::kLaunch);
  }

  std::string op_;
  Future<void> done_;
  std::atomic<bool> finished_{false};
  mutable std::atomic<bool> launch_asked_{false};
  std::shared_ptr<const Driver> driver_;
  std::function<void(const std::exception_ptr&)> on_finish_;
  bool recorded_ = false;  // set_record()
  uint64_t record_ = 0;
  int64_t seq_ = -1;
  std::string group_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace gw::dist
