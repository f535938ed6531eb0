// gw::Future<T> — the result of an asynchronous operation, completed exactly once.
//
// Mental model (torch.futures.Future): a shared handle to a slot that some thread fills with a
// value (set_result) or an error (set_exception). Copies share the slot. `wait()` blocks and
// returns the value or rethrows the error; `then(f)` chains a continuation that receives the
// completed future and whose return value (or exception) completes the returned future.
// Callbacks run on the thread that completes the future (inline if it is already done), so
// they should be short; an RPC agent completes futures on its network thread.
//
//   gw::Future<Tensor> fut = gw::rpc::rpc_async("worker1", my_add, x, y);  // or any async API
//   gw::Future<Tensor> plus_one = fut.then([](gw::Future<Tensor>& f) { return f.wait() + 1; });
//   Tensor r = plus_one.wait(std::chrono::seconds(5));  // TimeoutError if not done by then
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace gw {

template <typename T>
class Future;

namespace detail {
template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {};
}  // namespace detail

template <typename T>
inline constexpr bool is_future_v = detail::IsFuture<std::decay_t<T>>::value;

// Marks this thread, while the scope lives, as one that may not wait: a wait on a future not
// done yet throws StateError naming `why` instead of blocking (e.g. the thread that reads the
// frames which would complete it).
class NoWaiting {
 public:
  explicit NoWaiting(const char* why) : previous_(t_why) { t_why = why; }
  ~NoWaiting() { t_why = previous_; }
  NoWaiting(const NoWaiting&) = delete;
  NoWaiting& operator=(const NoWaiting&) = delete;
  static const char* why() { return t_why; }

 private:
  static inline thread_local const char* t_why = nullptr;
  const char* previous_;
};

template <typename T = void>
class Future {
  using Stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

 public:
  using value_type = T;
  using Callback = std::function<void(Future<T>&)>;

  Future() : state_(std::make_shared<State>()) {}

  // A future that is already complete.
  template <typename U = T>
  requires(!std::is_void_v<U>) static Future ready(U value) {
    Future f;
    f.set_result(std::move(value));
    return f;
  }
  static Future ready() requires std::is_void_v<T> {
    Future f;
    f.set_result();
    return f;
  }
  static Future failed(std::exception_ptr error) {
    Future f;
    f.set_exception(std::move(error));
    return f;
  }

  bool done() const { return state_->ready.load(std::memory_order_acquire); }
  bool has_error() const {
    std::lock_guard lock(state_->mu);
    return state_->done && state_->error;
  }

  // Blocks until done; returns the value or rethrows the error.
  T wait() const {
    check_may_wait();
    if (state_->ready.load(std::memory_order_acquire)) return completed_result();  // no lock
    spin_briefly();
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    return completed_result();
  }
  // Like wait(), but throws gw::TimeoutError if the future is not done within `timeout`.
  template <typename Rep, typename Period>
  T wait(std::chrono::duration<Rep, Period> timeout) const {
    check_may_wait();
    spin_briefly();
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; }))
      throw TimeoutError(gw::detail::str(
          "[Future::wait] not completed within ",
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms"));
    return completed_result();
  }
  // The value of a completed future; throws StateError if it is still pending.
  T value() const {
    std::lock_guard lock(state_->mu);
    GW_CHECK(state_->done, StateError, "[Future::value] the future is not completed yet");
    return completed_result();
  }
  // The error of a completed future, or nullptr.
  std::exception_ptr exception() const {
    std::lock_guard lock(state_->mu);
    return state_->error;
  }

  template <typename U = T>
  requires(!std::is_void_v<U>) void set_result(U value) {
    complete([&](State& s) { s.value.emplace(std::move(value)); });
  }
  void set_result() requires std::is_void_v<T> {
    complete([](State& s) { s.value.emplace(); });
  }
  void set_exception(std::exception_ptr error) {
    complete([&](State& s) { s.error = std::move(error); });
  }
  // Completes the future from the outcome of `f()`: its value or what it throws.
  template <typename F>
  void set_from(F&& f) {
    std::exception_ptr error;
    try {
      if constexpr (std::is_void_v<T>) {
        f();
        set_result();
      } else {
        set_result(f());
      }
    } catch (...) {
      error = std::current_exception();
    }
    // Outside the catch: waiters on other threads may drop the exception first (see
    // tests/tsan.supp: only exception_ptr's release may be the last owner then).
    if (error) set_exception(std::move(error));
  }

  // Runs `cb(*this)` once the future completes: inline if it already has.
  void add_done_callback(Callback cb) {
    {
      std::lock_guard lock(state_->mu);
      if (!state_->done) {
        state_->callbacks.push_back(std::move(cb));
        return;
      }
    }
    Future self = *this;
    cb(self);
  }

  // Chains a continuation: `f(Future<T>&)` runs when this completes; its result completes the
  // returned future, and an exception it throws fails it. If `f` returns a Future, the returned
  // future follows that one (flattened), as async execution needs.
  template <typename F>
  auto then(F f) {
    using R = std::invoke_result_t<F, Future<T>&>;
    if constexpr (is_future_v<R>) {
      using U = typename std::decay_t<R>::value_type;
      Future<U> out;
      add_done_callback([out, f = std::move(f)](Future<T>& self) mutable {
        std::exception_ptr error;
        try {
          f(self).add_done_callback([out](Future<U>& inner) mutable { out.follow(inner); });
        } catch (...) {
          error = std::current_exception();
        }
        if (error) out.set_exception(std::move(error));  // outside the catch, as in set_from
      });
      return out;
    } else {
      Future<R> out;
      add_done_callback([out, f = std::move(f)](Future<T>& self) mutable {
        out.set_from([&]() -> R { return f(self); });
      });
      return out;
    }
  }

  // Completes this future with the outcome of `other`, which must be done.
  void follow(const Future<T>& other) {
    std::exception_ptr e = other.exception();
    if (e) {
      set_exception(e);
    } else if constexpr (std::is_void_v<T>) {
      set_result();
    } else {
      set_result(other.value());
    }
  }

 private:
  template <typename U>
  friend class Future;

  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::atomic<bool> ready{false};  // `done`, readable without the lock (done(), wait())
    std::optional<Stored> value;
    std::exception_ptr error;
    std::vector<Callback> callbacks;
  };

  void check_may_wait() const {
    if (const char* why = NoWaiting::why(); why && !state_->ready.load(std::memory_order_acquire))
      throw StateError(gw::detail::str(
          "[Future::wait] the future is not done and this thread may not wait: ", why));
  }

  // A reply often comes within tens of microseconds: waiting that long without sleeping saves
  // the wake-up of a blocked thread, which costs about as much. Bounded, then wait() blocks.
  void spin_briefly() const {
    if (state_->ready.load(std::memory_order_acquire)) return;  // no clock to read
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (!state_->ready.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }

  // Under the lock, or once `ready`: after that nothing writes them.
  T completed_result() const {
    if (state_->error) std::rethrow_exception(state_->error);
    if constexpr (!std::is_void_v<T>) return *state_->value;
  }

  // A waiter may return as soon as `ready` is set, and drop its copy: whoever completes a
  // future keeps its own alive until this returns (a Future member of an object the waiter may
  // free is completed through a copy, or by a caller that holds the object).
  template <typename Fill>
  void complete(Fill fill) {
    std::vector<Callback> callbacks;
    {
      std::lock_guard lock(state_->mu);
      GW_CHECK(!state_->done, StateError, "[Future::set_result] the future is already completed");
      fill(*state_);
      state_->done = true;
      state_->ready.store(true, std::memory_order_release);
      callbacks.swap(state_->callbacks);
    }
    state_->cv.notify_all();
    if (callbacks.empty()) return;
    Future self = *this;
    // One callback that throws must not keep the others (e.g. an RPC response) from running.
    for (auto& cb : callbacks) {
      try {
        cb(self);
      } catch (const std::exception& e) {
        log_error("a Future callback threw: ", e.what());
      } catch (...) {
        log_error("a Future callback threw a non-std exception");
      }
    }
  }

  std::shared_ptr<State> state_;
};

// A future completed when every input is; its value is the inputs, each done (value or error).
template <typename T>
Future<std::vector<Future<T>>> collect_all(std::vector<Future<T>> futures) {
  Future<std::vector<Future<T>>> out;
  if (futures.empty()) {
    out.set_result({});
    return out;
  }
  struct Join {
    std::atomic<size_t> remaining;
    std::vector<Future<T>> futures;
  };
  auto join = std::make_shared<Join>();
  join->remaining = futures.size();
  join->futures = futures;
  for (auto& f : futures)
    f.add_done_callback([join, out](Future<T>&) mutable {
      if (join->remaining.fetch_sub(1) == 1) out.set_result(join->futures);
    });
  return out;
}

// Waits for every future; returns their values in order, or rethrows the first error.
template <typename T>
auto wait_all(const std::vector<Future<T>>& futures) {
  if constexpr (std::is_void_v<T>) {
    for (const auto& f : futures) f.wait();
  } else {
    std::vector<T> values;
    values.reserve(futures.size());
    for (const auto& f : futures) values.push_back(f.wait());
    return values;
  }
}

}  // namespace gw
