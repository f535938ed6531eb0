// HangWatch: gwrun's side of the hang doctor (debug/doctor.h).
//
// Every worker gets a file for its flight recorder dumps (GW_DEBUG_DUMP_FILE, in the user's
// GW_DEBUG_DUMP_DIR, else in a directory gwrun makes and removes unless a diagnosis used the
// dumps) and a progress file (GW_PROGRESS_FILE, debug/progress.h, always in gwrun's own
// directory) in which its recorder counts the collectives and RPCs it starts and finishes. With
// --debug-on-timeout S, the job has stalled once no local worker's counters have moved for S
// seconds while one of them waits on something. Then, or when a worker fails after its own
// operation timed out (it dumps then), gwrun asks every live worker for a dump (SIGUSR1), waits a
// few seconds for them, and prints the doctor's findings:
//
//   [gwrun] hang doctor: collectives on default_pg: rank 1 is in allreduce #57 [4096] float32
//           while ranks 0, 2 are in broadcast #57 [4096] float32 root 0: ...
//
//   HangWatch watch(options.debug_on_timeout_s);
//   env += watch.environment(local_rank, rank);    // each worker, each round (after start_round)
//   if (watch.stalled(alive)) for (auto& line : watch.diagnose(workers)) ...
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "debug/progress.h"

namespace gw::gwrun {

class HangWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // A worker as the doctor sees it: alive (asked for a dump), or gone and how.
  struct Target {
    int rank;
    pid_t pid;
    bool alive;
    std::string exit;  // "exited with code 1", for one that is gone
  };

  // `stall_s`: --debug-on-timeout (0: no stall detection). Throws IoError if the directory
  // cannot be made.
  explicit HangWatch(double stall_s);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // A new attempt with `nproc` local workers: fresh progress files, no dump of it yet.
  void start_round(int nproc);
  // GW_DEBUG_DUMP_DIR, GW_DEBUG_DUMP_FILE and GW_PROGRESS_FILE for local worker `local_rank`,
  // of global rank `rank`.
  std::vector<std::pair<std::string, std::string>> environment(int local_rank, int rank) const;

  // Whether the job has stalled (always false without --debug-on-timeout): the counters of the
  // local workers still `alive` (by local rank) stood still for the whole window while one
  // waits. Looks at most every 250 ms; a stall is reported once per round.
  bool stalled(const std::vector<bool>& alive);
  // When stalled() wants to look next (Clock::time_point::max() without --debug-on-timeout).
  Clock::time_point next_check() const { return next_check_; }
  // Whether rank `rank` dumped during this round because an operation of its timed out or
  // failed (not only on its way out).
  bool dumped_on_failure(int rank) const;
  // Asks the live targets for a dump (SIGUSR1 to each one's process group), waits up to 5 s
  // for them, and returns the diagnosis, one finding per line, and where the dumps are.
  std::vector<std::string> diagnose(const std::vector<Target>& targets);

 private:
  std::string dump_file(int rank) const;
  std::string progress_file(int local_rank) const;
  // The dump of `rank` if it was written at or after `since_us` (µs since the epoch).
  std::optional<std::string> read_dump(int rank, int64_t since_us) const;

  double stall_s_;
  std::string own_dir_;      // made by gwrun: the progress files, the dumps unless the user's
  std::string dump_dir_;     // GW_DEBUG_DUMP_DIR, else own_dir_
  bool keep_dumps_ = false;  // a diagnosis used them: they stay
  int64_t round_start_us_ = 0;
  std::vector<std::unique_ptr<debug::ProgressFile>> progress_;
  std::vector<debug::ProgressCounts> last_;
  Clock::time_point last_change_{};
  Clock::time_point next_check_ = Clock::time_point::max();
  bool reported_ = false;
};

}  // namespace gw::gwrun
