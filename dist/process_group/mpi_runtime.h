// gw::dist::detail::MpiRuntime — the process's MPI, as the MPI process group uses it
// (process_group_mpi.cpp).
//
// One per process, made by the first group: it initializes MPI with MPI_THREAD_MULTIPLE
// (unless the program did), and at exit shuts the live groups down, then finalizes MPI if it
// initialized it. Its watchdog thread ends the job (MPI_Abort) when an operation stays in MPI
// past its timeout, since MPI cannot cancel one. An operation says it is in MPI by holding a
// Watch, which links itself into the runtime's list without allocating (one per collective):
//
//   {
//     MpiRuntime::Watch watch(op, where, timeout);  // "allreduce", "rank 0 of 2 in group g"
//     MPI_Allreduce(...);
//   }  // left in time: unlinked; still in MPI at its deadline: the job ends
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/process_group/types.h"

namespace gw::dist::detail {

using MpiClock = std::chrono::steady_clock;

// MpiClock::now() as of the kernel's last tick, plus one tick (so normally not earlier than now;
// a late tick makes it a few ms early at worst): every collective's deadline is stamped with it,
// for a few nanoseconds where a clock read costs tens.
MpiClock::time_point coarse_now();

class MpiRuntime {
 public:
  static MpiRuntime& get() {
    static MpiRuntime* runtime = new MpiRuntime();  // a constructor that threw is tried again
    return *runtime;
  }

  // While alive, operation `op` of `where` ("rank 0 of 2 in group default_pg") is in MPI and
  // must leave within `timeout`. Both strings outlive it; the message is made only if it fires.
  class Watch {
   public:
    Watch(const std::string& op, const std::string& where, Milliseconds timeout)
        : runtime_(get()),
          deadline_(coarse_now() + timeout),
          op_(op),
          where_(where),
          timeout_(timeout) {
      std::lock_guard lock(runtime_.mu_);
      runtime_.check_open_locked(op);
      older_ = runtime_.in_mpi_;
      if (older_) older_->newer_ = this;
      runtime_.in_mpi_ = this;
      // The watchdog sleeps until the earliest deadline it knew of: woken only for an earlier
      // one (a collective's costs no system call on the common path).
      if (deadline_ < runtime_.wake_at_) runtime_.cv_.notify_all();
    }
    ~Watch() {
      std::lock_guard lock(runtime_.mu_);
      (newer_ ? newer_->older_ : runtime_.in_mpi_) = older_;
      if (older_) older_->newer_ = newer_;
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    friend class MpiRuntime;
    MpiRuntime& runtime_;
    const MpiClock::time_point deadline_;
    const std::string& op_;
    const std::string& where_;
    const Milliseconds timeout_;
    Watch* newer_ = nullptr;  // neighbours in the runtime's list (newest first), under its lock
    Watch* older_ = nullptr;
  };

  // StateError naming `op` once the process is exiting (MPI is being finalized).
  void check_open(const std::string& op) {
    std::lock_guard lock(mu_);
    check_open_locked(op);
  }
  // A group's way to be shut down at exit, before MPI_Finalize (it may outlive main: in a
  // static, or in init_process_group's default group). Returns the id for forget().
  uint64_t remember(std::function<void()> shut_down);
  void forget(uint64_t id);

  MPI_Op half_sum = MPI_OP_NULL, bf16_sum = MPI_OP_NULL;  // float16 and bfloat16 sums
  int tag_upper_bound = 32767;                            // the least MPI guarantees

 private:
  MpiRuntime();
  void watchdog();
  void at_exit();
  void check_open_locked(const std::string& op) const {
    GW_CHECK(!closing_, StateError, "[", op, "] the process is exiting: MPI is being finalized");
  }

  bool owned_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  Watch* in_mpi_ = nullptr;  // the operations in MPI now: a list through the Watches
  MpiClock::time_point wake_at_ = MpiClock::time_point::min();  // when the watchdog looks next
  uint64_t next_ = 1;
  bool stopping_ = false;
  bool closing_ = false;                              // at exit: MPI calls are refused
  std::map<uint64_t, std::function<void()>> groups_;  // live groups' shut-downs
  std::thread thread_;
};

// Whether MPI was finalized (then a communicator is not freed: MPI freed it).
bool mpi_finalized();

}  // namespace gw::dist::detail
