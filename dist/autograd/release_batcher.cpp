#include "dist/autograd/release_batcher.h"

#include <algorithm>

#include "core/error.h"

namespace gw::dist::autograd {

ReleaseBatcher::ReleaseBatcher(Send send, std::chrono::microseconds interval)
    : send_(std::move(send)), interval_(interval), thread_([this] { run(); }) {}

ReleaseBatcher::~ReleaseBatcher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ReleaseBatcher::enqueue(int worker, uint64_t context_id) {
  bool wake;
  {
    std::lock_guard lock(mu_);
    queued_[worker].push_back(context_id);
    wake = idle_;  // during the pause between batches the thread wakes by itself
  }
  if (wake) wake_.notify_one();
}

void ReleaseBatcher::send_queued(std::unique_lock<std::mutex>& lock) {
  std::map<int, std::vector<uint64_t>> batches;
  batches.swap(queued_);
  ++sending_;
  lock.unlock();
  std::vector<Future<void>> sent;
  for (auto& [worker, ids] : batches) sent.push_back(send_(worker, std::move(ids)));
  lock.lock();
  std::erase_if(in_flight_, [](const Future<void>& f) { return f.done(); });
  for (auto& f : sent) in_flight_.push_back(std::move(f));
  --sending_;
  sent_.notify_all();
}

void ReleaseBatcher::run() {
  std::unique_lock lock(mu_);
  while (true) {
    idle_ = true;
    wake_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
    idle_ = false;
    if (stopping_) return;
    send_queued(lock);
    // What queues up meanwhile goes in the next batch.
    wake_.wait_for(lock, interval_, [&] { return stopping_; });
  }
}

void ReleaseBatcher::flush(std::chrono::milliseconds timeout) {
  std::vector<Future<void>> pending;
  {
    std::unique_lock lock(mu_);
    send_queued(lock);
    sent_.wait(lock, [&] { return sending_ == 0; });  // the thread's batch, if it is sending one
    pending.swap(in_flight_);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& f : pending) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      f.wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (const TimeoutError&) {
      if (!f.done())
        throw;  // our own deadline; a batch that failed with a (remote) timeout
                // was reported by send_ like any other failure
    } catch (const std::exception&) {
      // send_ reported it; the batch is over.
    }
  }
}

}  // namespace gw::dist::autograd
