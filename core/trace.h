// gw::trace — a timeline of what a process did, as a Chrome trace / Perfetto JSON file.
//
// Mental model: with GW_TRACE=FILE in its environment (or after trace::start(FILE)), a process
// collects spans — autograd backward passes, DDP forwards and buckets, each collective on its
// group's track, each RPC on both sides — and writes them to FILE.rank<R>.json when it exits
// (or at trace::stop()). Flow arrows join what belongs together across processes: an RPC's
// request to its handler and the handler to the response, and each collective on rank 0 to
// the same collective on every other rank. gwrun merges its workers' files into FILE, one
// process per rank: open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing.
//
//   gw::trace::start("run.json");                  // or GW_TRACE=run.json
//   {
//     gw::trace::Scope span("train", "step 3");    // a span on this thread
//     ...
//   }
//   gw::trace::stop();                              // writes run.json.rank<R>.json
//
// Off (the default), every call costs one relaxed atomic load. On, a span costs about a
// microsecond: a clock read, a lock and an append to a buffer bounded by GW_TRACE_MAX_EVENTS
// (default 1,000,000; later events are dropped and counted).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gw::trace {

namespace detail {
extern std::atomic<bool> g_enabled;
}  // namespace detail

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Starts collecting into `path` (the file written is path.rank<R>.json). Throws StateError if
// a trace is already being collected.
void start(const std::string& path);
// Writes the file and stops collecting; returns its path ("" if no trace was on).
std::string stop();
// Stops collecting and writes nothing: for a launcher, whose GW_TRACE is its workers'.
void cancel();
// Who this process is: its rank (the merged timeline's process id) and a name for it. The
// default rank is RANK from the environment, else 0.
void set_process(int rank, const std::string& name);
int rank();

// Microseconds on the system clock, the timeline's time base (shared by the ranks of a host).
int64_t now_us();
// The same clock as of the kernel's last tick (behind by up to one tick, 1/HZ: 1-10 ms), for
// what stamps every collective and call (the flight recorder): a few nanoseconds where now_us()
// costs tens.
int64_t coarse_now_us();
// A named track of this process (a process group's collectives), as a thread id.
int track(const std::string& name);
int current_thread();

// One span: `cat` groups spans ("autograd", "collective", "rpc"); `args` is a JSON object's
// text or empty. tid: current_thread() or a track().
void complete(const char* cat, std::string name, int64_t start_us, int64_t end_us, int tid,
              std::string args = {});
// A flow arrow's start ("s") or end ("f"), bound to the span enclosing `ts_us` on `tid`: put it
// strictly inside the span (spans of at least 2 µs).
void flow(bool start, uint64_t id, int64_t ts_us, int tid);
// Flow ids, the same on both ends and apart from each other: an RPC's request (caller → the
// callee's handler) and response (handler → the caller's answer), numbered by the caller's id
// and the message id; and collective `seq` of `group` from rank 0 to rank `peer`.
uint64_t rpc_flow(int caller, uint64_t message_id, bool response);
uint64_t collective_flow(const std::string& group, int64_t seq, int peer);
// `s` as a JSON string, quoted and escaped: for a span's args.
std::string json_string(const std::string& s);

// A span on the calling thread from construction to destruction (nothing when off).
class Scope {
 public:
  Scope(const char* cat, std::string name, std::string args = {});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* cat_;
  std::string name_, args_;
  int64_t start_ = -1;  // -1: off when made
};

// Merges per-rank trace files into one (their events side by side, each rank its own
// process). Throws IoError naming a file that cannot be read or written.
void merge(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace gw::trace
