// gw::dist::Work — the handle of a collective in flight (c10d's Work).
//
// Every collective returns at once with a Work; wait() blocks until it finished on this rank
// and rethrows its error (gw::IoError when a peer died, gw::TimeoutError when it timed out).
// Tensors given to a collective must not be touched until then.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "rpc/future.h"

namespace gw::dist {

class Work {
 public:
  explicit Work(std::string op) : op_(std::move(op)) {}

  // Throws what the collective raised. With a timeout: TimeoutError if it is still running
  // then (the collective itself goes on and fails by its own timeout).
  void wait() const { done_.wait(); }
  void wait(std::chrono::milliseconds timeout) const { done_.wait(timeout); }
  bool is_completed() const { return done_.done(); }
  bool is_success() const { return done_.done() && !done_.has_error(); }
  std::exception_ptr exception() const { return done_.exception(); }
  const std::string& op() const { return op_; }

  // For the process group that runs it.
  Future<void>& future() { return done_; }

 private:
  std::string op_;
  Future<void> done_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace gw::dist
