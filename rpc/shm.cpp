#include "rpc/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <utility>

#include "core/error.h"

namespace gw::rpc::shm {

namespace {

constexpr size_t kTokenBytes = 16;
constexpr uint64_t kMagic = 0x31676d6873777267;  // "grwshmg1"
// A writer publishes (and may wake the reader) after each chunk of this much, so that a large
// frame is read while the rest of it is still being copied in.
constexpr size_t kPublishBytes = 256 * 1024;

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string inode_of(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? std::to_string(st.st_ino) : "?";
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* limit) {
  // Not FUTEX_PRIVATE: the word is shared with another process.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, limit, nullptr, 0);
}

}  // namespace

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds limit) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(limit);
  const timespec ts{static_cast<time_t>(s.count()), static_cast<long>((limit - s).count())};
  futex(word, FUTEX_WAIT, seen, &ts);  // returns at once if the word is no longer `seen`
}

void futex_wake_all(std::atomic<uint32_t>* word) { futex(word, FUTEX_WAKE, INT32_MAX, nullptr); }

// --- mappings --------------------------------------------------------------------------------

Mapping Mapping::create(size_t bytes, const char* what) {
  const int fd = ::memfd_create(what, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  GW_CHECK(fd >= 0, IoError, "[", what, "] memfd_create: ", std::strerror(errno));
  // Sized and sealed before anyone else can see it: a peer cannot shrink it beneath us (which
  // would turn our reads into SIGBUS).
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError(gw::detail::str("[", what, "] sizing a shared mapping of ", bytes,
                                  " bytes: ", std::strerror(e)));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw IoError(
        gw::detail::str("[", what, "] mapping ", bytes, " shared bytes: ", std::strerror(e)));
  }
  return Mapping(fd, base, bytes);
}

Mapping Mapping::open(int32_t pid, int32_t fd_there, size_t bytes, const char* what) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd_there);
  // Looked at before it is opened for real: O_PATH opens nothing (no device's open runs, no
  // FIFO waits), so only a sealed regular file of the offered size is opened, through our own
  // descriptor of it.
  const int where = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  GW_CHECK(where >= 0, InvalidArgumentError, "[", what, "] cannot open the peer's mapping ", path,
           ": ", std::strerror(errno));
  struct stat st {};
  const bool regular =
      ::fstat(where, &st) == 0 && S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) == bytes;
  const int fd = regular ? ::open(("/proc/self/fd/" + std::to_string(where)).c_str(),
                                  O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
                         : -1;
  ::close(where);
  const int seals = fd >= 0 ? ::fcntl(fd, F_GET_SEALS) : -1;
  // The size again, now that it can no longer shrink.
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(fd, &st) != 0 ||
      static_cast<size_t>(st.st_size) != bytes) {
    if (fd >= 0) ::close(fd);
    throw InvalidArgumentError(gw::detail::str(
        "[", what, "] ", path, " is not a sealed mapping of the offered size ", bytes));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps it
  GW_CHECK(base != MAP_FAILED, IoError, "[", what, "] mapping ", path, ": ", std::strerror(errno));
  return Mapping(-1, base, bytes);
}

Mapping::Mapping(Mapping&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(other.bytes_) {}

Mapping::~Mapping() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  close_fd();
}

void Mapping::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

const std::string& host_identity() {
  static const std::string id = [] {
    const std::string boot = read_line("/proc/sys/kernel/random/boot_id");
    return boot.empty()
               ? std::string()  // no /proc: never co-located
               : boot + "/net:" + inode_of("/proc/self/ns/net") +
                     "/pid:" + inode_of("/proc/self/ns/pid") + "/uid:" + std::to_string(::getuid());
  }();
  return id;
}

// The segment's first page: who made it, then each side's bell and each ring's positions, each
// on its own cache line. The rings follow it.
struct Segment::Control {
  struct alignas(64) Bell {
    std::atomic<uint32_t> seq;       // the futex word
    std::atomic<uint32_t> sleeping;  // the side waits on seq
  };
  struct alignas(64) Position {
    std::atomic<uint64_t> value;
  };
  uint64_t magic;
  uint64_t ring_bytes;
  char token[kTokenBytes];
  std::atomic<uint32_t> attached;  // side 1 has mapped it
  Bell bell[2];      // bell[s]: side s sleeps on it
  Position head[2];  // ring d (side d writes, side 1-d reads): written by its reader
  Position tail[2];  // written by its writer
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "positions and bells are shared between processes: they must be lock-free");
namespace {
constexpr size_t kControlBytes = 4096;
}

Segment::Segment(Mapping mapping, int side, uint64_t ring_bytes)
    : mapping_(std::move(mapping)),
      side_(side),
      ring_bytes_(ring_bytes),
      control_(static_cast<Control*>(mapping_.base())) {}

Segment::~Segment() = default;

void Segment::close_fd() { mapping_.close_fd(); }

uint8_t* Segment::ring(int direction) const {
  return static_cast<uint8_t*>(mapping_.base()) + kControlBytes +
         static_cast<size_t>(direction) * ring_bytes_;
}

std::unique_ptr<Segment> Segment::create(uint64_t ring_bytes) {
  GW_CHECK(ring_bytes >= kMinRingBytes && ring_bytes <= kMaxRingBytes && ring_bytes % 4096 == 0,
           InvalidArgumentError, "[rpc shm] ring of ", ring_bytes,
           " bytes: must be a multiple of 4096 in [", kMinRingBytes, ", ", kMaxRingBytes, "]");
  static_assert(sizeof(Control) <= kControlBytes);
  Mapping mapping = Mapping::create(kControlBytes + 2 * ring_bytes, "rpc shm");
  auto* c = new (mapping.base()) Control{};
  c->magic = kMagic;
  c->ring_bytes = ring_bytes;
  GW_CHECK(::getrandom(c->token, kTokenBytes, 0) == static_cast<ssize_t>(kTokenBytes), IoError,
           "[rpc shm] getrandom: ", std::strerror(errno));
  return std::unique_ptr<Segment>(new Segment(std::move(mapping), 0, ring_bytes));
}

Offer Segment::offer() const {
  return {host_identity(), static_cast<int32_t>(::getpid()), mapping_.fd(), ring_bytes_,
          std::string(control_->token, kTokenBytes)};
}

std::unique_ptr<Segment> Segment::attach(const Offer& offer) {
  GW_CHECK(!offer.host.empty() && offer.host == host_identity(), InvalidArgumentError,
           "[rpc shm] the peer is on another host (or namespace): '", offer.host, "', here '",
           host_identity(), "'");
  GW_CHECK(offer.ring_bytes >= kMinRingBytes && offer.ring_bytes <= kMaxRingBytes &&
               offer.ring_bytes % 4096 == 0 && offer.token.size() == kTokenBytes,
           InvalidArgumentError, "[rpc shm] a malformed offer: ring of ", offer.ring_bytes,
           " bytes, token of ", offer.token.size());
  Mapping mapping =
      Mapping::open(offer.pid, offer.fd, kControlBytes + 2 * offer.ring_bytes, "rpc shm");
  const std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  auto seg = std::unique_ptr<Segment>(new Segment(std::move(mapping), 1, offer.ring_bytes));
  Control* c = seg->control_;
  GW_CHECK(c->magic == kMagic && c->ring_bytes == offer.ring_bytes &&
               std::memcmp(c->token, offer.token.data(), kTokenBytes) == 0,
           InvalidArgumentError, "[rpc shm] ", path, " does not hold the offered segment");
  // One peer per segment: an offer replayed on another connection is refused.
  GW_CHECK(c->attached.exchange(1) == 0, InvalidArgumentError, "[rpc shm] ", path,
           " is already in use by another connection");
  return seg;
}

// --- the rings -------------------------------------------------------------------------------

size_t Segment::write(const uint8_t* data, size_t n) {
  const int d = side_;
  const uint64_t head = control_->head[d].value.load(std::memory_order_acquire);
  GW_CHECK(head <= tail_ && tail_ - head <= ring_bytes_, IoError,
           "[rpc shm] the peer corrupted the ring (head ", head, ", tail ", tail_, ")");
  size_t left = std::min<uint64_t>(n, ring_bytes_ - (tail_ - head));
  const size_t taken = left;
  uint8_t* base = ring(d);
  while (left > 0) {
    const size_t at = tail_ % ring_bytes_;
    const size_t chunk = std::min({left, static_cast<size_t>(ring_bytes_ - at), kPublishBytes});
    std::memcpy(base + at, data, chunk);
    data += chunk, left -= chunk, tail_ += chunk;
    control_->tail[d].value.store(tail_, std::memory_order_release);
    notify_peer();
  }
  return taken;
}

bool Segment::out_full() const {
  // Any thread: the shared copy of our tail (ours is the writer's, under its lock). Positions
  // that do not add up read as room, so that the writer finds out.
  const uint64_t tail = control_->tail[side_].value.load(std::memory_order_relaxed);
  const uint64_t head = control_->head[side_].value.load(std::memory_order_acquire);
  return head <= tail && tail - head >= ring_bytes_;
}

bool Segment::peer_sleeping() const {
  return control_->bell[1 - side_].sleeping.load(std::memory_order_acquire) != 0;
}

std::span<const uint8_t> Segment::readable() const {
  const int d = 1 - side_;
  const uint64_t tail = control_->tail[d].value.load(std::memory_order_acquire);
  GW_CHECK(head_ <= tail && tail - head_ <= ring_bytes_, IoError,
           "[rpc shm] the peer corrupted the ring (head ", head_, ", tail ", tail, ")");
  const size_t at = head_ % ring_bytes_;
  return {ring(d) + at, std::min<uint64_t>(tail - head_, ring_bytes_ - at)};
}

void Segment::consume(size_t n) {
  const uint64_t before = head_;
  head_ += n;
  control_->head[1 - side_].value.store(head_, std::memory_order_release);
  // The writer waits for room only when it found its ring full, so it is woken only when the
  // ring was full before this: a ring thread woken with nothing to do costs a context switch
  // and its spin, once a message on a busy machine. Pairs with the fence in sleep(): either the
  // sleeper sees the room made here, or we see the tail that filled the ring and its flag.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t tail = control_->tail[1 - side_].value.load(std::memory_order_relaxed);
  if (tail - before >= ring_bytes_ &&
      control_->bell[1 - side_].sleeping.load(std::memory_order_relaxed) != 0)
    ring_bell(1 - side_);
}

// --- waking ----------------------------------------------------------------------------------

void Segment::ring_bell(int side) {
  Control::Bell& b = control_->bell[side];
  b.seq.fetch_add(1, std::memory_order_release);
  futex(&b.seq, FUTEX_WAKE, 1, nullptr);
}

void Segment::notify_peer() {
  // Pairs with the fence in sleep(): either the sleeper sees what we published, or we see it
  // sleeping.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control_->bell[1 - side_].sleeping.load(std::memory_order_relaxed) != 0) ring_bell(1 - side_);
}

void Segment::notify_self() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control_->bell[side_].sleeping.load(std::memory_order_relaxed) != 0) ring_bell(side_);
}

void Segment::wake_self() { ring_bell(side_); }

void Segment::sleep(const std::function<bool()>& ready, std::chrono::milliseconds limit) {
  Control::Bell& b = control_->bell[side_];
  const uint32_t seen = b.seq.load(std::memory_order_acquire);
  b.sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ready()) futex_wait(&b.seq, seen, limit);  // returns at once if rung since `seen`
  b.sleeping.store(0, std::memory_order_relaxed);
}

}  // namespace gw::rpc::shm
