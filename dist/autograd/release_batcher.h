// Context releases, sent in batches (PyTorch sends one message per context and worker).
//
// A training loop leaves a context every iteration, and telling every worker it reached costs a
// message each time. Ids queued for a worker go out together in one message, at most once per
// `interval` from a background thread; flush() sends what is queued at once and waits for every
// batch sent so far (tests, graceful shutdown).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/future.h"

namespace gw::dist::autograd {

class ReleaseBatcher {
 public:
  // Sends one batch; the future completes when the worker (and those it told) released them.
  using Send = std::function<Future<void>(int worker, std::vector<uint64_t> context_ids)>;

  ReleaseBatcher(Send send, std::chrono::microseconds interval);
  ~ReleaseBatcher();  // stops the thread; what is still queued is dropped
  ReleaseBatcher(const ReleaseBatcher&) = delete;
  ReleaseBatcher& operator=(const ReleaseBatcher&) = delete;

  void enqueue(int worker, uint64_t context_id);
  // Throws TimeoutError if the batches are not all done within `timeout`.
  void flush(std::chrono::milliseconds timeout);

 private:
  void run();
  void send_queued(std::unique_lock<std::mutex>& lock);  // releases the lock while sending

  Send send_;
  const std::chrono::microseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::map<int, std::vector<uint64_t>> queued_;
  std::vector<Future<void>> in_flight_;
  int sending_ = 0;  // batches taken from queued_ but not yet in in_flight_
  std::condition_variable sent_;
  bool stopping_ = false;
  bool idle_ = false;  // waiting for work (not pausing between batches)
  std::thread thread_;
};

}  // namespace gw::dist::autograd
