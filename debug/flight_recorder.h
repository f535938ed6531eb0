// gw::debug — what a worker is doing, for when a distributed job stops making progress.
//
// Mental model (PyTorch's NCCL flight recorder, for everything distributed): every process
// keeps a flight recorder, a bounded ring of the last GW_FLIGHT_RECORDER_SIZE (default 2000;
// 0 turns it off) operations it started — collectives, RPCs it sent and served (RRef
// operations among them), distributed backward passes — each with its state and times. Parts that
// hold live state (an agent's pending calls and pool, distributed autograd's contexts) add a
// section. get_debug_info() is all of it as JSON. The process writes it to
// $GW_DEBUG_DUMP_DIR/gw_debug.rank<R>.json (else the temporary directory) on SIGUSR1 and when
// one of its operations times out or a collective fails, and gwrun's hang doctor (doctor.h)
// reads every rank's file to say which rank is where.
//
//   uint64_t id = gw::debug::record({.kind = gw::debug::Kind::kCollective, .group = "default_pg",
//                                    .seq = 57, .op = "allreduce", .detail = "[4096] float32"});
//   ...
//   gw::debug::update(id, gw::debug::State::kCompleted);
//   std::cout << gw::debug::get_debug_info();
//
// Recording costs one uncontended lock and a few copies into a preallocated slot; moving an
// event's state costs one compare-and-swap; nothing is allocated. A process whose launcher set
// GW_PROGRESS_FILE also counts the operations started and finished in that shared file, which
// gwrun watches to tell a stalled job (progress.h).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "core/future.h"

namespace gw::debug {

enum class Kind : uint8_t {
  kCollective,    // a process group's collective or point-to-point transfer
  kRpcCall,       // a request this worker sent (peer: the callee's id): calls, remote(),
                  // RRef fetches and the RRef protocol's messages
  kRpcServe,      // a request this worker runs for another (peer: the caller's id)
  kDistAutograd,  // a distributed backward pass
};
enum class State : uint8_t { kScheduled, kStarted, kCompleted, kFailed };
const char* to_string(Kind kind);
const char* to_string(State state);

struct EventInfo {
  Kind kind = Kind::kCollective;
  State state = State::kStarted;  // kScheduled or kStarted
  std::string_view group;         // the process group, or the RPC worker recording it
  int64_t seq = -1;               // collective: its number in the group (from 1); RPC: message id
  std::string_view op;            // "allreduce", "call of 'f'"
  std::string_view detail;        // "[4096] float32", the root, the tag
  int peer = -1;                  // the other worker or rank, if one
};

// Starts an event; returns its id, 0 when the recorder is off. Strings longer than a slot's
// fields are cut.
uint64_t record(const EventInfo& event);
// Moves event `id` (0: ignored) to `state`, unless it ended already; kFailed takes the error's
// first line. Safe to call after the ring has overwritten it (the progress counts still move).
void update(uint64_t id, State state, std::string_view error = {});
// kCompleted, or kFailed with `failure`'s message.
void finish(uint64_t id, const std::exception_ptr& failure);
// finish() when `future` completes.
template <typename T>
void finish_when_done(uint64_t id, Future<T>& future) {
  future.add_done_callback([id](Future<T>& f) { finish(id, f.exception()); });
}

// Who this process is in its job, named in its dumps (default: RANK from the environment); an
// empty name keeps the last one.
void set_identity(int rank, std::string_view name);

// A part of the process that adds a section to get_debug_info(): `json` returns the section's
// value as JSON text. The section goes when the handle is destroyed.
class Section {
 public:
  Section() = default;
  Section(std::string name, std::function<std::string()> json);
  ~Section();
  Section(Section&& other) noexcept;
  Section& operator=(Section&& other) noexcept;

 private:
  uint64_t id_ = 0;
};

// Everything, as one JSON object: {"rank", "name", "pid", "dumped_at_us", "reason",
// "events": [...oldest first], "sections": {...}}. Times are microseconds since the epoch, the
// events' as of the kernel's last tick (trace::coarse_now_us), dumped_at_us exact.
std::string get_debug_info(std::string_view reason = "asked");

// Where this process's dumps go: GW_DEBUG_DUMP_FILE (gwrun names each worker's), else
// gw_debug.rank<R>.json in GW_DEBUG_DUMP_DIR, else in the temporary directory.
std::string dump_path();
// Writes get_debug_info() to dump_path() (through a temporary file and a rename: a reader
// sees a whole file or none). Returns the path.
std::string dump_now(std::string_view reason);
// dump_now on the recorder's own thread (never blocks the caller), at most once per 100 ms
// for the same reason. From an operation that timed out or failed.
void request_dump(std::string_view reason);
// Makes SIGUSR1 dump (on the recorder's thread), unless the program installed a handler of
// its own. Called by init_process_group and the RPC agent; idempotent.
void dump_on_sigusr1();

}  // namespace gw::debug
