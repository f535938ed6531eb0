#include "rpc/thread_pool.h"

#include "core/error.h"

namespace gw::rpc {

ThreadPool::ThreadPool(int num_threads, std::function<void()> on_start) {
  GW_CHECK(num_threads > 0, InvalidArgumentError, "[ThreadPool] num_threads must be positive, got ",
           num_threads);
  for (int i = 0; i < num_threads; ++i)
    threads_.emplace_back([this, on_start] {
      if (on_start) on_start();
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock lock(mu_);
          ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
          if (tasks_.empty()) return;  // stopping and drained
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

}  // namespace gw::rpc
