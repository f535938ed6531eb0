#include "rpc/dispatcher.h"

#include "core/log.h"
#include "rpc/autograd_hook.h"

namespace gw::rpc {

Dispatcher::Dispatcher(std::string name, int num_threads, std::function<void()> on_thread_start)
    : name_(std::move(name)),
      num_threads_(num_threads),
      on_thread_start_(std::move(on_thread_start)),
      pool_(std::make_unique<ThreadPool>(num_threads, on_thread_start_)) {}

void Dispatcher::finish() {
  std::lock_guard lock(mu_);
  if (--active_ == 0) idle_.notify_all();
}

// Submits under mu_, so that stop() never resets a pool being submitted to.
void Dispatcher::run(Handler handler, uint64_t autograd_context, Done done, Runs where) {
  auto task = [this, autograd_context, handler = std::move(handler),
               done = std::move(done)]() mutable {
    Future<IValue> outcome;
    try {
      AutogradContextScope in_context(autograd_context);
      outcome = handler();
    } catch (...) {
      outcome = Future<IValue>::failed(std::current_exception());
    }
    // The request and its arguments go before the answer does (the handler holds the only
    // reference): the RRefs among them are released, their deletes sent, before the caller
    // can see the call done.
    handler = nullptr;
    // Async functions complete later, on whichever thread finishes their future.
    outcome.add_done_callback([this, done = std::move(done)](Future<IValue>& r) {
      try {
        done(r);
      } catch (const std::exception& e) {
        log_error(name_, ": answering a request failed: ", e.what());
      } catch (...) {
        log_error(name_, ": answering a request failed");
      }
      finish();
    });
  };
  std::unique_lock lock(mu_);
  GW_CHECK(!stopped_, StateError, "[rpc] worker '", name_,
           "' is shut down: it runs no more requests");
  if (where == Runs::kInline) {
    ++active_;
    lock.unlock();
    NoWaiting here(
        "it runs an RPC function registered to run inline (gw::rpc::Runs::kInline), on the "
        "thread that reads the frames which would complete the future");
    return task();
  }
  queued_.fetch_add(1, std::memory_order_relaxed);  // before the task can take it off
  pool_->submit([this, task = std::move(task)]() mutable {
    queued_.fetch_sub(1, std::memory_order_relaxed);
    busy_.fetch_add(1, std::memory_order_relaxed);
    struct Idle {
      std::atomic<int>& busy;
      ~Idle() { busy.fetch_sub(1, std::memory_order_relaxed); }
    } idle{busy_};
    task();
  });
  ++active_;  // once submitted: its finish() waits for mu_, which this thread holds
}

void Dispatcher::run_apart(std::function<void()> task) {
  std::lock_guard lock(mu_);
  GW_CHECK(!stopped_, StateError, "[rpc] worker '", name_, "' is shut down");
  if (!apart_) apart_ = std::make_unique<ThreadPool>(1, on_thread_start_);
  apart_->submit([this, task = std::move(task)] {
    try {
      task();
    } catch (const std::exception& e) {
      log_error(name_, ": ", e.what());
    }
    finish();
  });
  ++active_;
}

bool Dispatcher::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  auto idle = [&] { return active_ == 0; };
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    idle_.wait(lock, idle);
    return true;
  }
  return idle_.wait_until(lock, deadline, idle);
}

int Dispatcher::stop(std::chrono::milliseconds bound) {
  std::unique_ptr<ThreadPool> apart;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    apart = std::move(apart_);
  }
  // Both run what was queued (their responses find closed connections).
  pool_.reset();
  apart.reset();
  std::unique_lock lock(mu_);
  idle_.wait_for(lock, bound, [&] { return active_ == 0; });
  return active_;
}

}  // namespace gw::rpc
