// gw::rpc::Dispatcher — where an agent's request handlers run: a pool of `num_worker_threads`
// threads, and the count of handlers not yet finished that a graceful shutdown waits for.
//
// Mental model: the network thread runs no user code but the functions registered to run
// inline (rpc/function_table.h). It routes each request on its variant (Agent::on_request) to
// a handler and hands the handler here; the handler runs on the pool (or, inline, on the
// calling thread) in the request's distributed autograd context and returns a future (already
// done, unless the function is asynchronous); `done` receives its outcome when it completes,
// on whichever thread completes it, and sends the response.
//
//   dispatcher.run([&] { return functions().invoke(name, args); }, ctx,
//                  [c, id](Future<IValue>& outcome) { respond(c, id, outcome); });
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "core/future.h"
#include "rpc/function_table.h"
#include "rpc/ivalue.h"
#include "rpc/thread_pool.h"

namespace gw::rpc {

class Dispatcher {
 public:
  using Handler = std::function<Future<IValue>()>;
  using Done = std::function<void(Future<IValue>&)>;

  // `on_thread_start` runs first on every pool thread. `name` names the worker in logs.
  Dispatcher(std::string name, int num_threads, std::function<void()> on_thread_start);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Runs `handler` on the pool with distributed autograd context `autograd_context` (0: none)
  // current; a throw becomes its failed outcome. Throws StateError once stopped. Runs::kInline
  // runs it on this thread instead, before returning, where a wait on a future not done yet
  // throws StateError (NoWaiting, core/future.h).
  void run(Handler handler, uint64_t autograd_context, Done done, Runs where = Runs::kOnPool);
  // Runs `task` on a thread of its own (made on first use), FIFO, never behind the pool's
  // queue: work that handlers may be waiting for, such as placing a response's CUDA tensors.
  void run_apart(std::function<void()> task);
  // Blocks until every handler has finished (its outcome delivered), or until `deadline`:
  // false then.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Runs what is queued, then joins the pool; afterwards waits up to `bound` for asynchronous
  // handlers still to finish, and returns how many did not.
  int stop(std::chrono::milliseconds bound);

  // How busy the pool is, for get_debug_info(): its threads, those running a handler now, and
  // the handlers queued behind them (handlers run inline are not counted).
  struct Load {
    int threads, busy, queued;
  };
  Load load() const { return {num_threads_, busy_.load(), queued_.load()}; }

 private:
  void finish();  // a task counted in active_ is done

  const std::string name_;
  const int num_threads_;
  std::atomic<int> busy_{0};
  std::atomic<int> queued_{0};
  const std::function<void()> on_thread_start_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ThreadPool> apart_;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable idle_;
  int active_ = 0;
  bool stopped_ = false;
};

}  // namespace gw::rpc
