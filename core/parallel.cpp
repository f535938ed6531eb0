// A minimal fork-join pool: parallel_for hands each worker one contiguous chunk and runs the
// first chunk itself. One job at a time (kernels do not nest parallel_for), so a mutex around
// the whole call keeps it simple.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace gw {

namespace {

class Pool {
 public:
  ~Pool() { resize(0); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int workers) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    // A new worker must not take the last finished job for a new one.
    for (int i = 0; i < workers; ++i) {
      workers_.emplace_back([this, i, g = generation_] { loop(i, g); });
    }
  }

  // Runs f(chunk) for chunk in [0, chunks): chunk 0 on the caller, others on workers.
  void run(int chunks, const std::function<void(int)>& f) {
    std::unique_lock lock(mu_);
    job_ = &f;
    chunks_ = chunks;
    pending_ = chunks - 1;
    error_ = nullptr;
    ++generation_;
    lock.unlock();
    cv_.notify_all();
    try {
      f(0);
    } catch (...) {
      std::lock_guard g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int index, uint64_t seen) {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      int chunk = index + 1;
      if (chunk >= chunks_) continue;
      const auto* job = job_;
      lock.unlock();
      std::exception_ptr err;
      try {
        (*job)(chunk);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int chunks_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

std::mutex g_pool_mu;  // one parallel region at a time; also guards resizing
Pool& pool() {
  static Pool p;
  return p;
}
std::atomic<int> g_num_threads{1};
thread_local bool t_in_parallel_region = false;

}  // namespace

void set_num_threads(int n) {
  GW_CHECK(n >= 1 && n <= 1024, InvalidArgumentError,
           "[set_num_threads] expected 1..1024 threads, got ", n);
  std::lock_guard lock(g_pool_mu);
  pool().resize(n - 1);
  g_num_threads = n;
}

int get_num_threads() { return g_num_threads.load(std::memory_order_relaxed); }

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f) {
  int64_t n = end - begin;
  if (n <= 0) return;
  int threads = get_num_threads();
  int64_t chunks = std::min<int64_t>(threads, (n + std::max<int64_t>(grain, 1) - 1) /
                                                  std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    f(begin, end);
    return;
  }
  // Nested calls, and calls while another thread uses the pool (two backward passes at
  // once), run serially instead of waiting.
  if (t_in_parallel_region) {
    f(begin, end);
    return;
  }
  std::unique_lock lock(g_pool_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    f(begin, end);
    return;
  }
  // The pool as it is under the lock: set_num_threads may have shrunk it since `threads` was
  // read, and chunks beyond its workers would never run.
  chunks = std::min<int64_t>(chunks, pool().size());
  int64_t per = (n + chunks - 1) / chunks;
  pool().run(static_cast<int>(chunks), [&](int c) {
    int64_t b = begin + c * per, e = std::min(end, b + per);
    bool prev = t_in_parallel_region;
    t_in_parallel_region = true;
    struct Reset {
      bool prev;
      ~Reset() { t_in_parallel_region = prev; }
    } reset{prev};
    if (b < e) f(b, e);
  });
}

}  // namespace gw
