#include "dist/process_group/mpi_runtime.h"

#include <cstdio>
#include <cstdlib>

#include <time.h>

#include "core/dtype.h"
#include "debug/flight_recorder.h"

namespace gw::dist::detail {

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// float16 and bfloat16 travel as MPI_UINT16_T and are summed by these (MPI has no such types).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromFloat(ToFloat(a[i]) + ToFloat(b[i]));
}
float half_bits_to_float(uint16_t b) { return half_to_float(Half{b}); }
uint16_t float_to_half_bits(float f) { return float_to_half(f).bits; }
float bf16_bits_to_float(uint16_t b) { return bfloat16_to_float(BFloat16{b}); }
uint16_t float_to_bf16_bits(float f) { return float_to_bfloat16(f).bits; }

}  // namespace

MpiClock::time_point coarse_now() {
  using std::chrono::nanoseconds, std::chrono::seconds;
  static const MpiClock::duration tick = [] {
    timespec res{};
    ::clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return std::chrono::duration_cast<MpiClock::duration>(seconds(res.tv_sec) +
                                                          nanoseconds(res.tv_nsec));
  }();
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);  // steady_clock is CLOCK_MONOTONIC
  return MpiClock::time_point(std::chrono::duration_cast<MpiClock::duration>(
                                  seconds(now.tv_sec) + nanoseconds(now.tv_nsec)) +
                              tick);
}

MpiRuntime::MpiRuntime() {
  int initialized = 0, finalized = 0, provided = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  GW_CHECK(!finalized, StateError, "[ProcessGroupMPI] MPI was finalized already");
  if (!initialized) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    owned_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  // Collectives run on the group's thread or on whichever thread waits for them, send and
  // receive on threads of their own, several groups side by side.
  GW_CHECK(provided >= MPI_THREAD_MULTIPLE, StateError, "[ProcessGroupMPI] MPI ",
           owned_ ? "provides" : "was initialized with", " ", thread_level_name(provided),
           "; gradwire's MPI group calls MPI from several threads and needs "
           "MPI_THREAD_MULTIPLE",
           owned_ ? "" : " (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided))");
  MPI_Op_create(&sum_16bit<half_bits_to_float, float_to_half_bits>, 1, &half_sum);
  MPI_Op_create(&sum_16bit<bf16_bits_to_float, float_to_bf16_bits>, 1, &bf16_sum);
  int* bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &bound, &found);
  if (found && bound) tag_upper_bound = *bound;
  thread_ = std::thread([this] { watchdog(); });
  std::atexit([] { get().at_exit(); });
}

void MpiRuntime::watchdog() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (!in_mpi_) {
      wake_at_ = MpiClock::time_point::max();
      cv_.wait(lock);
      continue;
    }
    const Watch* late = in_mpi_;
    for (const Watch* w = in_mpi_; w; w = w->older_)
      if (w->deadline_ < late->deadline_) late = w;
    if (MpiClock::now() < late->deadline_) {
      wake_at_ = late->deadline_;
      cv_.wait_until(lock, wake_at_);
      continue;
    }
    try {
      const std::string what =
          gw::detail::str("[", late->op_, "] ", late->where_, ": not completed within ",
                          late->timeout_.count(), " ms");
      lock.unlock();
      std::fprintf(stderr, "%s; MPI cannot cancel it: aborting the job (MPI_Abort, exit code 1)\n",
                   what.c_str());
      debug::dump_now(what);
    } catch (...) {  // the job ends all the same
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
}

uint64_t MpiRuntime::remember(std::function<void()> shut_down) {
  std::lock_guard lock(mu_);
  groups_.emplace(next_, std::move(shut_down));
  return next_++;
}

void MpiRuntime::forget(uint64_t id) {
  std::lock_guard lock(mu_);
  groups_.erase(id);
}

// Shuts every live group down (what they queued still runs), then refuses new operations,
// stops the watchdog, and finalizes MPI if gradwire initialized it and nothing is in MPI (a
// collective still blocked there would hold MPI_Finalize forever).
void MpiRuntime::at_exit() {
  std::map<uint64_t, std::function<void()>> groups;
  {
    std::lock_guard lock(mu_);
    groups.swap(groups_);
  }
  for (auto& [id, shut_down] : groups) shut_down();
  bool busy = false;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    stopping_ = true;
    busy = in_mpi_ != nullptr;
  }
  cv_.notify_all();
  thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !busy && !finalized) MPI_Finalize();
}

bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

}  // namespace gw::dist::detail
