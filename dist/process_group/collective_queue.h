// gw::dist::detail::CollectiveQueue — how a CPU process group runs its collectives: one at a
// time, in call order, each completing its Work before the next starts.
//
// Mental model: every rank calls the same collectives in the same order, so each rank numbers
// them alike (the tag) and runs them in that order. A collective runs on the group's own
// thread, or — when the thread that waits for it finds it next in line and nothing running —
// inline on that thread, which saves the hand-off to the group's thread and back (a small
// allreduce then costs what the backend's call costs).
//
// With `lazy_start`, the group's thread is not woken for each collective: a wake is a system
// call and, on a machine whose cores the ranks share, a context switch in the middle of
// someone's collective (it cost a third of MPI's bandwidth at 256 KiB on two cores). Instead:
//   - wait() runs the collective inline;
//   - future() and wait(timeout) — asynchronous use, like DDP's — start it on the group's
//     thread at once;
//   - anything else queued starts on the group's thread when it finds the collective still
//     unclaimed at two looks in a row. While collectives come, the thread looks every
//     kLaunchDelay, and less often (up to kMaxLaunchDelay) while waits claim them all: each
//     look is a wake, and with long collectives one a millisecond cost MPI 3% of its bandwidth
//     at 4 MiB. So a collective nobody claims starts at most kMaxLaunchDelay + kLaunchDelay
//     after it is queued. The thread sleeps kStayAwake after the last collective (the next one
//     wakes it), never while one waits to be claimed.
// A failure makes the group unusable:
// every later collective fails at once naming the first failure. abort() fails what runs and
// what is queued now, for a rank declared dead (group_liveness.h).
//
//   auto queue = CollectiveQueue::start({.backend = "gloo", .group_name = "default_pg",
//                                        .rank = 0, .size = 2, .timeout = 30min,
//                                        .attempt = run_and_translate_errors});
//   WorkPtr w = queue->enqueue(signature::barrier(), kGroupTimeout,
//                              [](uint32_t tag, Milliseconds timeout) { /* the backend's call */
//                              });
//   w->wait();
//   queue->shutdown();  // what was queued still runs; then the thread ends
//
// Send and receive take no part in that order: SideThreads runs each on a thread of its own.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group/debug_process_group.h"
#include "dist/process_group/types.h"
#include "dist/process_group/work.h"

namespace gw::dist::detail {

class CollectiveQueue final : public Work::Driver,
                              public std::enable_shared_from_this<CollectiveQueue> {
 public:
  // A collective's body: the backend's call with the collective's tag and timeout.
  using Job = std::function<void(uint32_t tag, Milliseconds timeout)>;
  // Runs `job` and returns its failure (null: success), turned into gradwire's errors naming
  // `op`: the backend's way of reporting errors.
  using Attempt = std::function<std::exception_ptr(const std::string& op, Milliseconds timeout,
                                                   const std::function<void()>& job)>;
  struct Options {
    std::string backend;     // "gloo", "mpi": in errors
    std::string group_name;  // the flight recorder's name of the group
    int rank = 0, size = 1;
    Milliseconds timeout = kDefaultCollectiveTimeout;  // a collective's, unless it sets one
    bool run_inline = true;  // whether a waiting thread may run its collective itself
    bool lazy_start = false;  // with run_inline: see above
    Attempt attempt;
  };

  // Starts the group's thread, which shares the queue: after an abort it may outlive the group.
  static std::shared_ptr<CollectiveQueue> start(Options options);

  // Queues `job` as the next collective, recorded in the flight recorder under `sig`. A job that
  // `returns_on_abort` (its backend wakes it when the group aborts: shared memory) may run on
  // a waiting thread even when Options::run_inline is off.
  WorkPtr enqueue(const CollectiveSignature& sig, Milliseconds timeout, Job job,
                  bool returns_on_abort = false);
  // Fails the running collective, everything queued and everything later with `failure`, now.
  // Returns false when the queue was aborted already.
  bool abort(std::exception_ptr failure);
  // `t`, or the group's timeout for kGroupTimeout.
  Milliseconds timeout_of(Milliseconds t) const;
  // "[op] the gloo group is unusable after an earlier failure: ..."
  std::exception_ptr unusable(const std::string& op, const std::exception_ptr& failure) const;

  // For the group's destructor: what was queued still runs (unless aborted first); then
  // `before_join` runs and the thread ends. After an abort, or when called on the group's own
  // thread (a Work's callback held the last reference), the thread is left to end by itself: it
  // may be held in the backend until the collective's own timeout. Later collectives are
  // refused; a second call does nothing.
  void shutdown(const std::function<void()>& before_join = {});

 private:
  using Clock = std::chrono::steady_clock;
  // How often the awake group thread looks at the queue while collectives wait to be claimed,
  // and at most how long it leaves between looks while waits claim them all.
  static constexpr std::chrono::milliseconds kLaunchDelay{1};
  static constexpr std::chrono::milliseconds kMaxLaunchDelay{8};
  // How long after the last collective the group's thread stays awake; then it sleeps until
  // the next one wakes it.
  static constexpr std::chrono::milliseconds kStayAwake{20};
  struct Queued {
    WorkPtr work;
    Milliseconds timeout;
    Job job;
    uint64_t record = 0;  // in the flight recorder
    bool seen = false;    // by a look of the group's thread: the next look runs it
  };
  explicit CollectiveQueue(Options options) : options_(std::move(options)) {}
  bool lazy() const { return options_.run_inline && options_.lazy_start; }
  // Its Works' driver: runs a collective inline in wait(), or launches it. A Work holds its
  // queue (only memory, once the group is gone: its thread ends at shutdown).
  void drive(const Work* work, Work::Drive drive) override;
  void run();                         // the group's thread
  void run_inline(const Work* work);  // runs `work` here if it is next and nothing runs
  void launch();                      // the group's thread starts what is queued now
  // Runs the front of the queue; called with `lock` held, returns with it held.
  void run_front(std::unique_lock<std::mutex>& lock);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  bool thread_asleep_ = false;  // the group's thread waits to be woken
  bool launch_ = false;         // launch(): run what is queued without waiting for kLaunchDelay
  uint64_t enqueued_ = 0;       // collectives ever queued: the thread stays awake while it grows
  std::exception_ptr broken_;   // the failure that made the group unusable
  std::exception_ptr aborted_;  // abort(): everything fails at once
  // The collective running, on the group's thread or inline in a wait(): run_front's, which
  // holds it meanwhile.
  const WorkPtr* current_ = nullptr;
  uint32_t next_tag_ = 0;
  int64_t next_seq_ = 1;  // the flight recorder's number of the next collective
  std::thread thread_;
};

// What waits for sends and receives besides the caller's own wait(): a thread of its own each,
// which completes its Work (they take no part in the collectives' order). Finished threads are
// joined as new ones start. A wait on the caller's thread is watched here too, so that closing
// wakes it like a side thread.
class SideThreads {
 public:
  // A wait running on the caller's thread: close() wakes it with `wake` and returns `work` with
  // the others. Returns the failure it was closed with instead, if it was. unwatch(token) when
  // the wait is over.
  std::exception_ptr watch(WorkPtr work, std::function<void()> wake, uint64_t* token);
  void unwatch(uint64_t token);
  // The failure it was closed with, or null.
  std::exception_ptr closed();
  // Runs `body` on a new thread (as a group thread: a Work's callbacks run there); `wake`, if
  // given, makes a blocked body return. Once closed, runs nothing and returns the failure it
  // was closed with.
  std::exception_ptr start(std::function<void()> body, WorkPtr work,
                           std::function<void()> wake = {});
  // Refuses later bodies with `failure`, wakes those still running and returns their Works.
  std::vector<WorkPtr> close(std::exception_ptr failure);
  // Joins every thread, also those started meanwhile (a finishing Work's callback may drop
  // another transfer's Work, which starts a thread to wait for it), or leaves them to end by
  // themselves. The destructor joins what is left.
  void join_all();
  void detach_all();
  SideThreads() = default;
  SideThreads(const SideThreads&) = delete;
  SideThreads& operator=(const SideThreads&) = delete;
  ~SideThreads() { join_all(); }

 private:
  struct Side {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    WorkPtr work;
    std::function<void()> wake;
  };
  std::mutex mu_;
  std::vector<Side> sides_;
  std::map<uint64_t, std::pair<WorkPtr, std::function<void()>>> watched_;
  uint64_t next_token_ = 0;
  std::exception_ptr closed_;
};

}  // namespace gw::dist::detail
