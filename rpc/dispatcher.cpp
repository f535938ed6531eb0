#include "rpc/dispatcher.h"

#include "rpc/autograd_hook.h"
#include "rpc/log.h"

namespace gw::rpc {

Dispatcher::Dispatcher(std::string name, int num_threads, std::function<void()> on_thread_start)
    : name_(std::move(name)),
      pool_(std::make_unique<ThreadPool>(num_threads, std::move(on_thread_start))) {}

void Dispatcher::run(Handler handler, uint64_t autograd_context, Done done) {
  GW_CHECK(pool_, StateError, "[rpc] worker '", name_, "' is shut down: it runs no more requests");
  {
    std::lock_guard lock(mu_);
    ++active_;
  }
  pool_->submit([this, autograd_context, handler = std::move(handler), done = std::move(done)] {
    Future<IValue> outcome;
    try {
      AutogradContextScope in_context(autograd_context);
      outcome = handler();
    } catch (...) {
      outcome = Future<IValue>::failed(std::current_exception());
    }
    // Async functions complete later, on whichever thread finishes their future.
    outcome.add_done_callback([this, done](Future<IValue>& r) {
      try {
        done(r);
      } catch (const std::exception& e) {
        log_error(name_, ": answering a request failed: ", e.what());
      }
      std::lock_guard lock(mu_);
      if (--active_ == 0) idle_.notify_all();
    });
  });
}

void Dispatcher::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return active_ == 0; });
}

int Dispatcher::stop(std::chrono::milliseconds bound) {
  pool_.reset();  // runs what was queued (their responses find closed connections)
  std::unique_lock lock(mu_);
  idle_.wait_for(lock, bound, [&] { return active_ == 0; });
  return active_;
}

}  // namespace gw::rpc
