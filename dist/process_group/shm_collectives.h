// gw::dist::detail::ShmCollectives — a group's allreduce, reduce-scatter, all-gather, broadcast
// and barrier through one shared memory segment, when every rank of the group is a process (or
// thread) of this host.
//
// Gloo moves every byte of a collective through loopback TCP, even between two processes of
// one machine, and pays a socket round trip per step: a 4-byte allreduce costs ~100 µs and a
// 55 MB one is bound by the kernel's copies. The MPI group is faster on one host because
// OpenMPI's shared-memory transport is; this gives the Gloo group the same.
//
// Mental model: rank 0 makes an anonymous memfd (rpc/shm.h's Mapping) and offers it through the
// group's store; every rank maps it. It holds, per rank, a cache line with that rank's barrier
// count, and two sets of slots, one slot per rank each. A collective goes through its buffers
// in chunks of a slot, alternating between the two sets. An allreduce's chunk:
//   1. each rank copies its chunk into its own slot, but for its own part r;   barrier
//   2. rank r reduces part r in place in its buffer: its own values, then every other rank's
//      slot in rank order; and copies the result into part r of its slot;     barrier
//   3. each rank copies every other part from its owner's slot.
// Every element is reduced by one rank in one order, so every rank ends with the same bits. A
// reduce-scatter is steps 1 and 2 for each rank's own block, an all-gather steps 1 and 3, a
// broadcast the root's step 1 and everyone's step 3. A slot set is written again two chunks
// later, after a barrier every reader has passed.
//
// A barrier publishes this rank's count (release) and waits until every count reaches it:
// spinning briefly, then asleep on a futex word that arrivals ring when someone sleeps. Waits
// end in an error, never a hang: past the collective's timeout (TimeoutError), when another
// rank reports a failure in the segment (its timeout is a TimeoutError here too), when a rank
// waited for left the group or its process ended (a pidfd per peer process, looked at between
// sleeps), or on abort() (the group's liveness declared a rank dead). After any failure the segment
// is unusable, on every rank. (A rank that times out at a barrier the others then pass lets them
// finish that collective: it alone fails it, and every rank fails the next.)
//
//   auto shm = ShmCollectives::connect(store, rank, size, /*wanted=*/true, timeout);
//   Piece whole{data, n * sizeof(float)};
//   if (shm) shm->allreduce({"allreduce", n, kind, describe, timeout}, {&whole, 1}, sizeof(float),
//                           sum);
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dist/process_group/types.h"
#include "rpc/shm.h"
#include "store/store.h"

namespace gw::dist::detail {

// c = a (op) b over n elements; c may be a or b (Gloo's reduce functions).
using ReduceFunction = void (*)(void* c, const void* a, const void* b, size_t n);
// Finishes n reduced elements in place, over `size` ranks (AVG's division), or null.
using FinishFunction = void (*)(void* data, size_t n, int size);
// A run of bytes of a collective's buffer; a buffer may be several laid end to end (the tensors
// of a coalesced allreduce, reduced where they are).
struct Piece {
  void* data;
  size_t bytes;
};
// Names a collective's kind (which one, its dtype, op and tag) in errors.
using DescribeKind = std::string (*)(uint64_t kind);

class ShmCollectives {
 public:
  // Every rank of a group calls it once, in the same order as the group's other rendezvous.
  // Returns a segment on every rank, or null on every rank when one is not for this group: a
  // rank on another host (or namespace), a rank that asked not to (`wanted` false), or a rank
  // that could not map it (the reason is logged). Throws TimeoutError if the ranks do not all
  // come within `timeout`.
  static std::shared_ptr<ShmCollectives> connect(store::Store& store, int rank, int size,
                                                 bool wanted, Milliseconds timeout);
  ~ShmCollectives();

  // What every rank must agree on about a collective: ranks that disagree on `count` or `kind`
  // all fail with InvalidArgumentError naming both (even with no elements: every collective
  // meets the other ranks once at least).
  struct Call {
    const char* op;         // the collective, in errors
    uint64_t count;         // elements (of each rank's part, for the flat collectives)
    uint64_t kind;          // the dtype, op and tag, as the group encodes them
    DescribeKind describe;  // names a kind in errors
    Milliseconds timeout;   // for the whole collective
  };
  // Reduces `call.count` elements of `element_bytes` in place, over every rank: the pieces laid
  // end to end (whole elements each). `finish`, if any, runs on each reduced element before any
  // rank copies it.
  void allreduce(const Call& call, std::span<const Piece> pieces, size_t element_bytes,
                 ReduceFunction reduce, FinishFunction finish = nullptr);
  // `input` holds one block of `call.count` elements per rank; `output` gets this rank's block,
  // reduced over every rank (its own first, then the others in rank order), then finished.
  void reduce_scatter(const Call& call, const void* input, void* output, size_t element_bytes,
                      ReduceFunction reduce, FinishFunction finish = nullptr);
  // `output` gets every rank's `call.count` bytes of `input`, in rank order.
  void all_gather(const Call& call, const void* input, void* output);
  // Every rank's `call.count` bytes at `data` become rank `root`'s.
  void broadcast(const Call& call, void* data, int root);
  // Returns once every rank has called it (`call.count` 0).
  void barrier(const Call& call);

  // Fails the collective waiting now, on every rank, and every later one, with IoError(why).
  void abort(const std::string& why);

  size_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Control;
  struct RankLine;
  ShmCollectives(rpc::shm::Mapping mapping, int rank, int size, size_t slot_bytes);
  uint8_t* slot(int set, int rank) const;
  RankLine& line(int rank) const;
  // Publishes the call in this rank's line (at `set`, its first chunk's) and starts its clock.
  void start(const Call& call, int set);
  // After the call's first barrier: every rank's line says the same.
  void check_agreement(const Call& call, int set);
  // Runs body(first, n, set, meet) for each chunk of `chunk` elements (one empty chunk when
  // there are none); meet() is meet(op), and the first one checks the agreement.
  template <typename Body>
  void each_chunk(const Call& call, size_t chunk, Body body);
  // A barrier: publishes this rank's next count and waits for every rank's (see the top),
  // until the running collective's deadline.
  void meet(const char* op);
  enum class Failure : uint8_t { kTimeout = 1, kMismatch = 2, kPeer = 3 };
  // Marks the segment failed, here (`why`) and for every rank, and wakes them.
  void mark_failed(const std::string& why, Failure failure);
  // Marks the segment failed for every rank, wakes them, and throws the error for `failure`.
  [[noreturn]] void fail(const char* op, const std::string& why, Failure failure);
  void check_usable(const char* op);
  // Fails if a rank this one waits for at barrier `target` left the group or its process ended.
  void check_waited_for(const char* op, uint64_t target);

  rpc::shm::Mapping mapping_;
  int rank_, size_;
  size_t slot_bytes_;
  Control* control_;
  uint64_t barriers_ = 0;  // this rank's count
  uint64_t chunks_ = 0;    // chunks so far: the next one's slot set is chunks_ % 2
  std::chrono::steady_clock::time_point deadline_;  // of the running collective
  Milliseconds timeout_{0};
  std::mutex failure_mu_;
  std::string failure_;  // the first failure; set once
  std::atomic<bool> failed_{false};
  std::vector<int> exits_;  // a pidfd per rank in another process, else -1
};

}  // namespace gw::dist::detail
