#include "dist/process_group/collective_queue.h"

#include "debug/flight_recorder.h"

namespace gw::dist::detail {

std::shared_ptr<CollectiveQueue> CollectiveQueue::start(Options options) {
  std::shared_ptr<CollectiveQueue> queue(new CollectiveQueue(std::move(options)));
  queue->thread_ = std::thread([queue] { queue->run(); });
  return queue;
}

void CollectiveQueue::drive(const Work* work, Work::Drive drive) {
  if (drive == Work::Drive::kRunInline)
    run_inline(work);
  else if (lazy())
    launch();
}

Milliseconds CollectiveQueue::timeout_of(Milliseconds t) const {
  return t.count() > 0 ? t : options_.timeout;
}

std::exception_ptr CollectiveQueue::unusable(const std::string& op,
                                             const std::exception_ptr& failure) const {
  return std::make_exception_ptr(StateError(
      gw::detail::str("[", op, "] the ", options_.backend,
                      " group is unusable after an earlier failure: ", what_of(failure))));
}

WorkPtr CollectiveQueue::enqueue(const CollectiveSignature& sig, Milliseconds timeout, Job job,
                                 bool returns_on_abort) {
  auto work = std::make_shared<Work>(sig.op);
  if (options_.run_inline || returns_on_abort) work->set_driver(shared_from_this());
  std::exception_ptr refused;
  {
    std::lock_guard lock(mu_);
    // Numbered and queued under one lock: the numbers follow the order the collectives run in.
    const uint64_t record = record_collective(options_.group_name, options_.rank, options_.size,
                                              next_seq_++, sig, work);
    if (!aborted_ && !stopping_) {
      queue_.push_back({work, timeout_of(timeout), std::move(job), record});
      ++enqueued_;
      if (thread_asleep_ || !lazy()) cv_.notify_all();
      return work;
    }
    refused = aborted_;
  }
  work->finish(refused ? unusable(sig.op, refused)
                       : std::make_exception_ptr(StateError(gw::detail::str(
                             "[", sig.op, "] the ", options_.backend, " group was shut down"))));
  return work;
}

bool CollectiveQueue::abort(std::exception_ptr failure) {
  std::vector<WorkPtr> failing;
  {
    std::lock_guard lock(mu_);
    if (aborted_) return false;
    aborted_ = failure;
    if (!broken_) broken_ = failure;
    if (current_) failing.push_back(*current_);
    for (auto& q : queue_) failing.push_back(q.work);
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& w : failing) w->finish(failure);
  return true;
}

void CollectiveQueue::run() {
  std::unique_lock lock(mu_);
  // Lazily (see the header): the time between looks, and how long no collective came.
  auto look_every = kLaunchDelay;
  auto idle = std::chrono::milliseconds(0);
  uint64_t enqueued_before = enqueued_;
  while (true) {
    if (!current_ && !queue_.empty()) {
      // Unless asked to start it, leave the front to a wait() that runs it inline: until the
      // next look.
      Queued& front = queue_.front();
      if (!lazy() || launch_ || stopping_ || front.seen) {
        run_front(lock);
        continue;
      }
      front.seen = true;
      look_every = kLaunchDelay;
    } else if (queue_.empty()) {  // nothing waited to be claimed: look less often
      look_every = std::min(look_every * 2, kMaxLaunchDelay);
    }
    if (queue_.empty()) launch_ = false;
    if (queue_.empty() && !current_ && stopping_) return;  // everything queued is done
    idle = enqueued_ == enqueued_before ? idle + look_every : std::chrono::milliseconds(0);
    enqueued_before = enqueued_;
    // Never asleep while a collective waits to be claimed: only a look would start it.
    const bool unclaimed = !current_ && !queue_.empty();
    if (lazy() && (unclaimed || idle < kStayAwake)) {
      cv_.wait_for(lock, look_every);  // collectives come often: look again soon
    } else {
      thread_asleep_ = true;
      cv_.wait(lock);
      thread_asleep_ = false;
      look_every = kLaunchDelay;
      idle = std::chrono::milliseconds(0);
      enqueued_before = enqueued_;
    }
  }
}

void CollectiveQueue::launch() {
  {
    std::lock_guard lock(mu_);
    if (queue_.empty() || launch_) return;
    launch_ = true;
  }
  cv_.notify_all();
}

void CollectiveQueue::run_inline(const Work* work) {
  std::unique_lock lock(mu_);
  if (current_ || queue_.empty() || queue_.front().work.get() != work) return;
  run_front(lock);
}

void CollectiveQueue::run_front(std::unique_lock<std::mutex>& lock) {
  Queued q = std::move(queue_.front());
  queue_.pop_front();
  current_ = &q.work;
  const uint32_t tag = next_tag_++;  // every rank numbers its collectives alike
  std::exception_ptr failed = broken_;
  lock.unlock();
  {
    GroupThreadScope on_group_thread;
    try {
      debug::update(q.record, debug::State::kStarted);
      if (failed)
        failed = unusable(q.work->op(), failed);
      else
        failed = options_.attempt(q.work->op(), q.timeout, [&] { q.job(tag, q.timeout); });
    } catch (...) {  // the queue must go on: current_ is cleared below whatever happened
      failed = std::current_exception();
    }
    if (failed) {
      // A backend's connections are unusable after an error in a collective: later ones would
      // hang.
      lock.lock();
      if (!broken_) broken_ = failed;
      lock.unlock();
    }
    // Completed (and its callbacks run) before the next collective may start: Works complete
    // in order.
    q.work->finish(failed);
  }
  lock.lock();
  current_ = nullptr;
  // The group's thread when there is more to run (unless it looks by itself soon), or a
  // shutdown waiting.
  if (stopping_ || (!queue_.empty() && (thread_asleep_ || launch_ || !lazy()))) cv_.notify_all();
}

void CollectiveQueue::shutdown(const std::function<void()>& before_join) {
  std::unique_lock lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  cv_.notify_all();
  if (t_on_group_thread) {
    // This thread cannot wait for itself; the rest of the queue still runs on the group's.
    lock.unlock();
    if (before_join) before_join();
    thread_.detach();
    return;
  }
  cv_.wait(lock, [&] { return (queue_.empty() && !current_) || aborted_ != nullptr; });
  const bool aborted = aborted_ != nullptr;
  lock.unlock();
  if (before_join) before_join();
  // After an abort the collective's thread may be held in the backend, waiting for a dead
  // rank, until the collective's own timeout: it is left to finish then (it keeps the queue).
  if (aborted)
    thread_.detach();
  else
    thread_.join();
}

std::exception_ptr SideThreads::start(std::function<void()> body, WorkPtr work,
                                      std::function<void()> wake) {
  std::lock_guard lock(mu_);
  if (closed_) return closed_;
  std::erase_if(sides_, [](Side& s) {
    if (!s.done->load()) return false;
    s.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  sides_.push_back({std::thread([body = std::move(body), done] {
                      GroupThreadScope on_group_thread;  // its Work's callbacks run here
                      body();
                      done->store(true);
                    }),
                    done, std::move(work), std::move(wake)});
  return nullptr;
}

std::exception_ptr SideThreads::watch(WorkPtr work, std::function<void()> wake, uint64_t* token) {
  std::lock_guard lock(mu_);
  if (closed_) return closed_;
  *token = next_token_++;
  watched_.emplace(*token, std::make_pair(std::move(work), std::move(wake)));
  return nullptr;
}

std::exception_ptr SideThreads::closed() {
  std::lock_guard lock(mu_);
  return closed_;
}

void SideThreads::unwatch(uint64_t token) {
  std::lock_guard lock(mu_);
  watched_.erase(token);
}

std::vector<WorkPtr> SideThreads::close(std::exception_ptr failure) {
  std::vector<WorkPtr> running;
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mu_);
    if (!closed_) closed_ = std::move(failure);
    for (auto& s : sides_)
      if (!s.done->load()) {
        if (s.work) running.push_back(s.work);
        if (s.wake) wake.push_back(s.wake);
      }
    for (auto& [token, watched] : watched_) {
      running.push_back(watched.first);
      if (watched.second) wake.push_back(watched.second);
    }
  }
  for (auto& w : wake) w();
  return running;
}

// Joined outside the lock: a Work's callback on one of them may start another.
void SideThreads::join_all() {
  while (true) {
    std::vector<Side> sides;
    {
      std::lock_guard lock(mu_);
      if (sides_.empty()) return;
      sides.swap(sides_);
    }
    for (auto& s : sides) s.thread.join();
  }
}

void SideThreads::detach_all() {
  std::vector<Side> sides;
  {
    std::lock_guard lock(mu_);
    sides.swap(sides_);
  }
  for (auto& s : sides) s.thread.detach();
}

}  // namespace gw::dist::detail
