// gw::dist::GroupLiveness — how a process group learns that one of its ranks died silently.
//
// Mental model: a collective cannot tell a dead peer from a slow one, and across hosts a dead
// peer is usually silent (power lost, a link down, a process stopped), so without help every
// rank waits out the collective's timeout (30 minutes). Each rank runs a watcher thread, apart
// from the collectives (a rank busy computing still beats). Through the group's store it
//   - beats: adds 1 to its own counter every heartbeat_period (store/liveness.h);
//   - watches the next rank's counter (a ring: rank r watches r+1), and declares that rank
//     dead when the counter has stood still for failure_timeout — unless the rank said it
//     left (its group was destroyed; then it watches the one after) — by recording it in the
//     store;
//   - reads that record a few times a second, and fails its own group (on_dead) as soon as
//     any rank is declared dead: every rank learns within half a second of the declaration.
// The store must answer as well: a watcher whose store calls have failed for failure_timeout
// fails its group too. Each call is bounded (Store::add_within). A watcher that itself ran
// late (its process was stopped) declares nobody dead on that round.
//
//   GroupLiveness live(store, rank, size, failure_timeout,
//                      [](const std::string& why) { /* fail the pending Works with why */ });
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/process_group/types.h"
#include "store/store.h"

namespace gw::dist {

class GroupLiveness {
 public:
  using OnDead = std::function<void(const std::string& why)>;

  // Starts the watcher; `failure_timeout` > 0. `on_dead` runs once, on the watcher's thread.
  GroupLiveness(std::shared_ptr<store::Store> store, int rank, int size,
                Milliseconds failure_timeout, OnDead on_dead);
  // Says this rank left (so it is not declared dead) and stops the watcher.
  ~GroupLiveness();
  GroupLiveness(const GroupLiveness&) = delete;
  GroupLiveness& operator=(const GroupLiveness&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  // One round; returns the reason the group failed, or empty.
  std::string round(Clock::time_point now, bool late);

  std::shared_ptr<store::Store> store_;
  const int rank_, size_;
  const Milliseconds failure_timeout_;
  OnDead on_dead_;

  // The watcher's own state.
  Clock::time_point last_beat_{}, last_change_, last_store_ok_;
  int next_;  // the rank watched: the next one that has not left
  int64_t next_count_ = -1;
  bool watching_ = true;  // false once every other rank left
  bool store_failed_ = false;

  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace gw::dist
