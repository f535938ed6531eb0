#include "dist/process_group/shm_collectives.h"

#include <poll.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/small_vector.h"

namespace gw::dist::detail {

namespace {

constexpr uint64_t kMagic = 0x32676d6873677767;  // "gwgshmg2"
constexpr size_t kTokenBytes = 16;
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
constexpr size_t kMaxSlotBytes = size_t{1} << 20;
constexpr size_t kAllSlotsBytes = size_t{32} << 20;  // over every rank, each of the two sets
// A broadcast's root travels in 16 bits of the kind ranks agree on (process_group_gloo.cpp).
constexpr int kMaxRanks = 1 << 16;
// A waiter polls this long before it sleeps: a barrier's peers are usually microseconds behind,
// and a wake-up costs about as much on a VM. Not longer: DDP's collectives wait on the group's
// thread beside backward, and on a machine with no core to spare a poll takes a core from it.
constexpr auto kSpin = std::chrono::microseconds(10);
// A sleeper looks at the clock and whether the ranks it waits for still live at least this
// often (a dead process rings nothing; abort(), fail() and a leaving rank do ring).
constexpr auto kMaxSleep = std::chrono::milliseconds(10);

std::string hex(const char* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[(static_cast<uint8_t>(data[i]) >> 4) & 0xf];
    s += digits[static_cast<uint8_t>(data[i]) & 0xf];
  }
  return s;
}

}  // namespace

// The segment's first page; the ranks' lines follow it, then the slots.
struct ShmCollectives::Control {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
  char token[kTokenBytes];
  alignas(kLine) std::atomic<uint32_t> bell;  // the futex word sleepers wait on
  std::atomic<uint32_t> sleepers;
  // The first failure on any rank: (rank + 1) << 8 | its Failure, or 0. One word, so that who
  // and how are read together.
  std::atomic<uint64_t> failure;
};

struct alignas(kLine) ShmCollectives::RankLine {
  std::atomic<uint64_t> arrived;  // barriers passed through (published with release)
  std::atomic<int32_t> pid;       // the rank's process
  std::atomic<uint32_t> left;     // its group was destroyed
  // A collective's element count and kind, for the check, at the slot set of its first chunk:
  // a rank ahead by one collective writes the other one. (Ordered by `arrived`: relaxed.)
  std::atomic<uint64_t> count[2];
  std::atomic<uint64_t> kind[2];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the segment's words are shared between processes: they must be lock-free");

namespace {

size_t lines_bytes(int size) { return (size * kLine + kPage - 1) / kPage * kPage; }

size_t segment_bytes(int size, size_t slot_bytes) {
  return kPage + lines_bytes(size) + 2 * static_cast<size_t>(size) * slot_bytes;
}

std::string key(const std::string& what, int rank) {
  return "gw_shm/" + what + "/" + std::to_string(rank);
}

}  // namespace

std::shared_ptr<ShmCollectives> ShmCollectives::connect(store::Store& store, int rank, int size,
                                                        bool wanted, Milliseconds timeout) {
  // 1. Where is everyone? A rank that does not want shared memory says so with an empty host.
  store.set(key("host", rank), wanted ? rpc::shm::host_identity() : std::string());
  store.set(key("pid", rank), std::to_string(::getpid()));
  auto all = [&](const std::string& what) {
    std::vector<std::string> keys, values;
    for (int r = 0; r < size; ++r) keys.push_back(key(what, r));
    store.wait(keys, timeout);
    for (const auto& k : keys) values.push_back(store.get_string(k));
    return values;
  };
  const std::vector<std::string> hosts = all("host");
  const bool together = size > 1 && size <= kMaxRanks &&
                        std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
                          return !h.empty() && h == hosts[0];
                        });
  if (!together) return nullptr;
  const std::vector<std::string> pids = all("pid");

  // 2. Rank 0 offers a segment; every rank maps it, opens a pidfd of every other process, and
  // says whether it could.
  // A reduce-scatter's chunk holds a window of every rank's block: 8 elements of 8 bytes at least.
  const size_t slot_bytes = std::max(
      std::clamp(kAllSlotsBytes / static_cast<size_t>(size) / kPage * kPage, kPage, kMaxSlotBytes),
      (static_cast<size_t>(size) * kLine + kPage - 1) / kPage * kPage);
  const size_t bytes = segment_bytes(size, slot_bytes);
  std::shared_ptr<ShmCollectives> shm;
  std::string failure;
  try {
    if (rank == 0) {
      rpc::shm::Mapping mapping = rpc::shm::Mapping::create(bytes, "process_group shm");
      auto* c = new (mapping.base()) Control{};
      c->magic = kMagic;
      c->size = static_cast<uint64_t>(size);
      c->slot_bytes = slot_bytes;
      c->failure.store(0);
      for (int r = 0; r < size; ++r)
        new (static_cast<uint8_t*>(mapping.base()) + kPage + r * kLine) RankLine{};
      GW_CHECK(::getrandom(c->token, kTokenBytes, 0) == static_cast<ssize_t>(kTokenBytes), IoError,
               "[process_group shm] getrandom: ", std::strerror(errno));
      store.set("gw_shm/offer", std::to_string(::getpid()) + " " + std::to_string(mapping.fd()) +
                                    " " + hex(c->token, kTokenBytes));
      shm.reset(new ShmCollectives(std::move(mapping), rank, size, slot_bytes));
    } else {
      store.wait({"gw_shm/offer"}, timeout);
      const std::string said = store.get_string("gw_shm/offer");
      GW_CHECK(said != "none", IoError, "[process_group shm] rank 0 could not make the segment");
      std::istringstream offer(said);
      int32_t pid = 0, fd = -1;
      std::string token;
      offer >> pid >> fd >> token;
      rpc::shm::Mapping mapping = rpc::shm::Mapping::open(pid, fd, bytes, "process_group shm");
      const auto* c = static_cast<const Control*>(mapping.base());
      GW_CHECK(c->magic == kMagic && c->size == static_cast<uint64_t>(size) &&
                   c->slot_bytes == slot_bytes && hex(c->token, kTokenBytes) == token,
               InvalidArgumentError, "[process_group shm] /proc/", pid, "/fd/", fd,
               " does not hold the offered segment");
      shm.reset(new ShmCollectives(std::move(mapping), rank, size, slot_bytes));
    }
    // The other processes' pidfds tell when one ends without leaving (killed, or exited).
    shm->exits_.assign(size, -1);
    for (int r = 0; r < size; ++r) {
      const int32_t pid = static_cast<int32_t>(std::stol(pids[r]));
      shm->line(r).pid.store(pid, std::memory_order_relaxed);  // for errors
      if (pid == ::getpid()) continue;
      shm->exits_[r] = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      GW_CHECK(shm->exits_[r] >= 0, IoError, "[process_group shm] pidfd_open of rank ", r, " (pid ",
               pid, "): ", std::strerror(errno));
    }
  } catch (const std::exception& e) {
    failure = e.what();
    shm.reset();
    if (rank == 0 && !store.check({"gw_shm/offer"})) store.set("gw_shm/offer", std::string("none"));
  }
  store.set(key("mapped", rank), failure.empty() ? std::string("ok") : failure);
  if (!failure.empty())
    log_error("[process_group] rank ", rank, " of ", size,
              ": collectives go through Gloo, not shared memory: ", failure);
  const std::vector<std::string> mapped = all("mapped");
  if (!shm || std::any_of(mapped.begin(), mapped.end(), [](const auto& m) { return m != "ok"; }))
    return nullptr;                         // on every rank
  if (rank == 0) shm->mapping_.close_fd();  // every rank has it mapped
  return shm;
}

ShmCollectives::ShmCollectives(rpc::shm::Mapping mapping, int rank, int size, size_t slot_bytes)
    : mapping_(std::move(mapping)),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      control_(static_cast<Control*>(mapping_.base())) {
  static_assert(sizeof(Control) <= kPage && sizeof(RankLine) == kLine);
}

ShmCollectives::~ShmCollectives() {
  line(rank_).left.store(1);
  control_->bell.fetch_add(1);
  rpc::shm::futex_wake_all(&control_->bell);  // a rank waiting for this one fails now
  for (int fd : exits_)
    if (fd >= 0) ::close(fd);
}

void ShmCollectives::check_waited_for(const char* op, uint64_t target) {
  for (int r = 0; r < size_; ++r) {
    if (line(r).arrived.load(std::memory_order_acquire) >= target) continue;
    if (line(r).left.load() != 0)
      fail(op, gw::detail::str("rank ", r, " left the group"), Failure::kPeer);
    pollfd exit{.fd = exits_[r], .events = POLLIN, .revents = 0};
    if (exit.fd >= 0 && ::poll(&exit, 1, 0) > 0)
      fail(op, gw::detail::str("rank ", r, " (pid ", line(r).pid.load(), ") exited"),
           Failure::kPeer);
  }
}

ShmCollectives::RankLine& ShmCollectives::line(int rank) const {
  return reinterpret_cast<RankLine*>(static_cast<uint8_t*>(mapping_.base()) + kPage)[rank];
}

uint8_t* ShmCollectives::slot(int set, int rank) const {
  return static_cast<uint8_t*>(mapping_.base()) + kPage + lines_bytes(size_) +
         (static_cast<size_t>(set) * size_ + rank) * slot_bytes_;
}

void ShmCollectives::abort(const std::string& why) { mark_failed(why, Failure::kPeer); }

void ShmCollectives::mark_failed(const std::string& why, Failure failure) {
  {
    std::lock_guard lock(failure_mu_);
    if (failure_.empty()) failure_ = why;
  }
  failed_.store(true);
  uint64_t none = 0;  // the other ranks' waits fail too
  control_->failure.compare_exchange_strong(
      none, static_cast<uint64_t>(rank_ + 1) << 8 | static_cast<uint64_t>(failure));
  control_->bell.fetch_add(1);
  rpc::shm::futex_wake_all(&control_->bell);  // our waiter, and any other rank's
}

void ShmCollectives::fail(const char* op, const std::string& why, Failure failure) {
  const std::string what =
      gw::detail::str("[", op, "] rank ", rank_, " of ", size_, " (shared memory): ", why);
  mark_failed(what, failure);
  if (failure == Failure::kTimeout) throw TimeoutError(what);
  if (failure == Failure::kMismatch) throw InvalidArgumentError(what);
  throw IoError(what);
}

void ShmCollectives::check_usable(const char* op) {
  if (failed_.load()) {
    std::lock_guard lock(failure_mu_);
    throw IoError(gw::detail::str("[", op, "] rank ", rank_, " of ", size_,
                                  ": the group's shared memory failed earlier: ", failure_));
  }
  // Another rank's: a timeout is this collective's too (the ranks wait for the same ones).
  if (const uint64_t failed = control_->failure.load(); failed != 0) {
    const auto how = static_cast<Failure>(failed & 0xff);
    const uint64_t who = (failed >> 8) - 1;
    if (how == Failure::kTimeout)
      fail(op, gw::detail::str("rank ", who, " timed out in a collective"), Failure::kTimeout);
    fail(op, gw::detail::str("rank ", who, " failed a collective"), Failure::kPeer);
  }
}

void ShmCollectives::meet(const char* op) {
  const auto deadline = deadline_;
  const uint64_t target = ++barriers_;
  line(rank_).arrived.store(target, std::memory_order_release);
  // Pairs with the fence of a sleeper below: either it sees our count, or we see it sleeping.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control_->sleepers.load(std::memory_order_relaxed) != 0) {
    control_->bell.fetch_add(1, std::memory_order_release);
    rpc::shm::futex_wake_all(&control_->bell);
  }
  auto all_here = [&] {
    for (int r = 0; r < size_; ++r)
      if (line(r).arrived.load(std::memory_order_acquire) < target) return false;
    return true;
  };
  auto failing = [&] { return failed_.load() || control_->failure.load() != 0; };
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (uint32_t polls = 0;; ++polls) {
    // A failure seen first, then everyone here: the failing rank arrived before it failed (it
    // publishes its count first), and this rank goes on to find the cause itself (a mismatch
    // fails every rank with its own InvalidArgumentError, not a report of another's).
    const bool failure = failing();
    if (all_here()) return;
    if (failure) check_usable(op);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (line(r).arrived.load(std::memory_order_acquire) < target)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      if (missing.empty()) return;  // they came meanwhile
      fail(op,
           gw::detail::str("timed out after ", timeout_.count(), " ms waiting for rank(s) ",
                           missing),
           Failure::kTimeout);
    }
    if (now < spin_until) {
      // Yield now and then: with more ranks than cores, the rank we wait for needs ours.
      if (polls % 16 == 15) sched_yield();
      continue;
    }
    const uint32_t seen = control_->bell.load(std::memory_order_acquire);
    control_->sleepers.fetch_add(1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!all_here() && !failing())
      rpc::shm::futex_wait(&control_->bell, seen,
                           std::min<std::chrono::nanoseconds>(deadline - now, kMaxSleep));
    control_->sleepers.fetch_sub(1);
    check_waited_for(op, target);
  }
}

void ShmCollectives::start(const Call& call, int set) {
  check_usable(call.op);
  deadline_ = std::chrono::steady_clock::now() + call.timeout;
  timeout_ = call.timeout;
  line(rank_).count[set].store(call.count, std::memory_order_relaxed);
  line(rank_).kind[set].store(call.kind, std::memory_order_relaxed);
}

void ShmCollectives::check_agreement(const Call& call, int set) {
  for (int r = 0; r < size_; ++r) {
    const uint64_t count = line(r).count[set].load(std::memory_order_relaxed);
    const uint64_t kind = line(r).kind[set].load(std::memory_order_relaxed);
    if (count != call.count || kind != call.kind)
      fail(call.op,
           gw::detail::str("the ranks disagree: rank ", r, " called it with ", count,
                           " elements of ", call.describe(kind), ", this rank with ", call.count,
                           " elements of ", call.describe(call.kind)),
           Failure::kMismatch);
  }
}

// The chunks of a collective of `count` elements, `chunk` at a time, each on the next slot set;
// with no elements, one empty chunk, so that every rank still meets the others and checks.
template <typename Body>
void ShmCollectives::each_chunk(const Call& call, size_t chunk, Body body) {
  const int first_set = static_cast<int>(chunks_ % 2);
  start(call, first_set);
  size_t first = 0;
  do {
    const size_t n = std::min<size_t>(chunk, call.count - first);
    const int set = static_cast<int>(chunks_++ % 2);
    body(first, n, set, [&, checked = first != 0]() mutable {
      meet(call.op);
      if (!checked) check_agreement(call, first_set);
      checked = true;
    });
    first += n;
  } while (first < call.count);
}

namespace {
// Pieces laid end to end, addressed by offset.
class Pieces {
 public:
  explicit Pieces(std::span<const Piece> pieces) {
    size_t at = 0;
    for (const Piece& p : pieces) {
      if (p.bytes == 0) continue;
      pieces_.push_back(p);
      starts_.push_back(at);
      at += p.bytes;
    }
  }
  size_t bytes() const { return starts_.empty() ? 0 : starts_.back() + pieces_.back().bytes; }
  // f(address, offset, bytes) for each run of [lo, hi) within one piece, in order.
  template <typename F>
  void each(size_t lo, size_t hi, F&& f) const {
    if (lo >= hi) return;
    size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), lo) -
                                   starts_.begin()) -
               1;
    for (; lo < hi; ++k) {
      const size_t end = std::min(hi, starts_[k] + pieces_[k].bytes);
      f(static_cast<uint8_t*>(pieces_[k].data) + (lo - starts_[k]), lo, end - lo);
      lo = end;
    }
  }
  void copy_out(size_t lo, size_t hi, uint8_t* to) const {  // to[0] gets byte lo
    each(lo, hi, [&](uint8_t* p, size_t at, size_t n) { std::memcpy(to + (at - lo), p, n); });
  }
  void copy_in(size_t lo, size_t hi, const uint8_t* from) const {  // byte lo gets from[0]
    each(lo, hi, [&](uint8_t* p, size_t at, size_t n) { std::memcpy(p, from + (at - lo), n); });
  }

 private:
  SmallVector<Piece, 4> pieces_;  // none empty
  SmallVector<size_t, 4> starts_;
};
}  // namespace

void ShmCollectives::allreduce(const Call& call, std::span<const Piece> pieces,
                               size_t element_bytes, ReduceFunction reduce, FinishFunction finish) {
  const Pieces buffer(pieces);
  GW_CHECK(buffer.bytes() == call.count * element_bytes, InternalError, "[", call.op, "] ",
           buffer.bytes(), " bytes given for ", call.count, " elements of ", element_bytes);
  // Each rank's part of a chunk, in whole cache lines where the chunk allows.
  const size_t line_elements = std::max<size_t>(1, kLine / element_bytes);
  each_chunk(call, slot_bytes_ / element_bytes, [&](size_t first, size_t n, int set, auto meet) {
    if (n == 0) return meet(), meet();
    const size_t at = first * element_bytes;  // the chunk's first byte in the buffer
    const size_t per = (n + size_ - 1) / size_ + line_elements - 1;
    const size_t part = per - per % line_elements;
    auto range = [&](int r) {  // in bytes, from the chunk's start
      const size_t lo = std::min(n, static_cast<size_t>(r) * part);
      return std::pair<size_t, size_t>{lo * element_bytes, std::min(n, lo + part) * element_bytes};
    };
    // The others reduce their parts from our slot; ours we reduce in the buffer itself.
    const auto [mine, mine_end] = range(rank_);
    uint8_t* own = slot(set, rank_);
    buffer.copy_out(at, at + mine, own);
    buffer.copy_out(at + mine_end, at + n * element_bytes, own + mine_end);
    meet();
    // Our part: ours, then every other rank's in rank order, in place; then into our slot.
    buffer.each(at + mine, at + mine_end, [&](uint8_t* p, size_t offset, size_t bytes) {
      const size_t in_slot = offset - at, count = bytes / element_bytes;
      for (int r = 0; r < size_; ++r)
        if (r != rank_) reduce(p, p, slot(set, r) + in_slot, count);
      if (finish) finish(p, count, size_);
      std::memcpy(own + in_slot, p, bytes);
    });
    meet();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const auto [lo, hi] = range(r);
      buffer.copy_in(at + lo, at + hi, slot(set, r) + lo);
    }
  });
}

void ShmCollectives::reduce_scatter(const Call& call, const void* input, void* output,
                                    size_t element_bytes, ReduceFunction reduce,
                                    FinishFunction finish) {
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  const size_t block = call.count * element_bytes;  // each rank's block of `input`
  // A chunk holds the same window of every rank's block: size_ windows per slot.
  const size_t chunk = slot_bytes_ / element_bytes / size_;  // >= 8: see connect()
  each_chunk(call, chunk, [&](size_t first, size_t n, int set, auto meet) {
    if (n == 0) return meet();
    const size_t at = first * element_bytes, len = n * element_bytes;
    uint8_t* own = slot(set, rank_);
    for (int r = 0; r < size_; ++r)  // our window of every other rank's block
      if (r != rank_) std::memcpy(own + r * len, in + r * block + at, len);
    meet();
    // Our block's window: ours, then every other rank's in rank order.
    if (out != in + rank_ * block) std::memcpy(out + at, in + rank_ * block + at, len);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) reduce(out + at, out + at, slot(set, r) + rank_ * len, n);
    if (finish) finish(out + at, n, size_);
    // A slot set is written again two chunks on, after the next chunk's meeting, which every
    // rank reaches only when done reading this one.
  });
}

void ShmCollectives::broadcast(const Call& call, void* data, int root) {
  auto* bytes = static_cast<uint8_t*>(data);
  each_chunk(call, slot_bytes_, [&](size_t first, size_t n, int set, auto meet) {
    if (n == 0) return meet();
    if (rank_ == root) std::memcpy(slot(set, root), bytes + first, n);
    meet();
    if (rank_ != root) std::memcpy(bytes + first, slot(set, root), n);
  });
}

void ShmCollectives::barrier(const Call& call) {
  each_chunk(call, 1, [](size_t, size_t, int, auto meet) { meet(); });
}

void ShmCollectives::all_gather(const Call& call, const void* input, void* output) {
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  each_chunk(call, slot_bytes_, [&](size_t first, size_t n, int set, auto meet) {
    if (n == 0) return meet();
    std::memcpy(slot(set, rank_), in + first, n);
    meet();
    for (int r = 0; r < size_; ++r) {
      const uint8_t* from = r == rank_ ? in + first : slot(set, r);
      if (out + r * call.count + first != from) std::memcpy(out + r * call.count + first, from, n);
    }
  });
}

}  // namespace gw::dist::detail
