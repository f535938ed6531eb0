// A fixed pool of threads running queued tasks in FIFO order; the agent runs requests on it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gw::rpc {

class ThreadPool {
 public:
  // `on_start` runs first on every thread (e.g. to set thread-local state).
  ThreadPool(int num_threads, std::function<void()> on_start);
  ~ThreadPool();  // finishes the queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace gw::rpc
