#include "dist/process_group/group_liveness.h"

#include "core/error.h"
#include "store/liveness.h"

namespace gw::dist {

namespace {
std::string beat_key(int rank) { return "liveness/beat/" + std::to_string(rank); }
std::string left_key(int rank) { return "liveness/left/" + std::to_string(rank); }
// The first declared rank + 1; the sum of several when more than one was declared at once.
constexpr const char* kDeadKey = "liveness/dead";
}  // namespace

GroupLiveness::GroupLiveness(std::shared_ptr<store::Store> store, int rank, int size,
                             Milliseconds failure_timeout, OnDead on_dead)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      failure_timeout_(failure_timeout),
      on_dead_(std::move(on_dead)),
      last_change_(Clock::now()),
      last_store_ok_(last_change_),
      next_((rank + 1) % size) {
  GW_CHECK(failure_timeout_.count() > 0, InvalidArgumentError,
           "[process_group] liveness needs a positive failure_timeout, got ",
           failure_timeout_.count(), " ms");
  watching_ = size_ > 1;
  thread_ = std::thread([this] { run(); });
}

GroupLiveness::~GroupLiveness() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  // on_dead may drop the last reference to the group, whose destructor destroys this on the
  // watcher's own thread: it cannot join itself.
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();
  else
    thread_.join();
  if (store_failed_) return;  // nobody can read it, and asking would wait the whole window
  try {
    store_->add_within(left_key(rank_), 1, failure_timeout_);
  } catch (const std::exception&) {
    // The store is gone: nobody is left to watch us.
  }
}

void GroupLiveness::run() {
  const Milliseconds period = store::liveness_check_period(failure_timeout_);
  auto last_round = Clock::now();
  std::unique_lock lock(mu_);
  while (!stopping_) {  // bounded by the group's life
    lock.unlock();
    const auto now = Clock::now();
    const bool late = store::check_ran_late(now - last_round, failure_timeout_);
    last_round = now;
    const std::string why = round(now, late);
    lock.lock();
    if (!why.empty()) {
      lock.unlock();
      on_dead_(why);
      return;
    }
    wake_.wait_for(lock, period, [&] { return stopping_; });
  }
}

std::string GroupLiveness::round(Clock::time_point now, bool late) {
  try {
    if (now - last_beat_ >= store::heartbeat_period(failure_timeout_)) {
      store_->add_within(beat_key(rank_), 1, failure_timeout_);
      last_beat_ = now;
    }
    if (const int64_t dead = store_->add_within(kDeadKey, 0, failure_timeout_); dead > 0) {
      const std::string who =
          dead <= size_ ? "rank " + std::to_string(dead - 1) : std::string("several ranks");
      return who + " declared dead: " + store::no_heartbeat_for(failure_timeout_);
    }
    if (watching_) {
      const int64_t count = store_->add_within(beat_key(next_), 0, failure_timeout_);
      if (count != next_count_ || late) {  // late: it may have beaten while we were stopped
        next_count_ = count;
        last_change_ = now;
      } else if (now - last_change_ > failure_timeout_) {
        if (store_->add_within(left_key(next_), 0, failure_timeout_) > 0) {
          // It destroyed its group: not a death. Watch the first one after it still there.
          do {
            next_ = (next_ + 1) % size_;
          } while (next_ != rank_ && store_->add_within(left_key(next_), 0, failure_timeout_) > 0);
          watching_ = next_ != rank_;
          next_count_ = -1;
          last_change_ = now;
        } else {
          store_->add_within(kDeadKey, next_ + 1, failure_timeout_);
          return "rank " + std::to_string(next_) + " declared dead by rank " +
                 std::to_string(rank_) + ": " + store::no_heartbeat_for(failure_timeout_);
        }
      }
    }
    last_store_ok_ = Clock::now();
  } catch (const std::exception& e) {
    if (!late && Clock::now() - last_store_ok_ > failure_timeout_) {
      store_failed_ = true;
      return "the group's store did not answer for " + store::failure_window(failure_timeout_) +
             ": " + e.what();
    }
  }
  return {};
}

}  // namespace gw::dist
