// gw::rpc::shm — the shared memory two RPC workers on one host exchange frames through, in
// place of their TCP connection's bytes (rpc/connection.h negotiates it and keeps the socket).
//
// Mental model: one segment per connection, an anonymous memfd the connecting side creates,
// sealed against shrinking, holding a byte ring per direction (single producer, single
// consumer: the writer holds the connection's write lock, the reader is the connection's own
// ring thread). The other side opens it through /proc/<pid>/fd/<n> (same host identity, same
// user) and proves it has the right one by the random token at its start; a memfd has no name,
// so nothing outlives the two processes. Ring positions are 64-bit counters that only grow: the
// writer publishes `tail` after copying, the reader publishes `head` after consuming, and each
// side checks what the other published (0 <= tail - head <= ring bytes) before using it.
//
// Nothing busy-polls a core. Each side has a bell (a futex word) and a "sleeping" flag: its ring
// thread spins briefly after its last work, then sets the flag and sleeps on the bell; the peer,
// after publishing data, or after freeing space in a ring it found full (only then can the
// writer wait for room), rings only when the flag is set (a store, a fence, a load: the sleeper
// re-checks after setting the flag, so no wake-up is lost).
//
//   auto seg = shm::Segment::create(2 << 20);                  // connecting side: side 0
//   send offer(seg->offer()) on the socket ...
//   auto peer = shm::Segment::attach(offer);                    // accepting side: side 1
//   seg->write(bytes, n); seg->notify_peer();                   // side 0 -> side 1
//   auto r = peer->readable(); ...; peer->consume(r.size());    // side 1 reads it
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace gw::rpc::shm {

inline constexpr uint64_t kMinRingBytes = 64 * 1024;
inline constexpr uint64_t kMaxRingBytes = uint64_t{1} << 30;

// What identifies this host to another process: boot id, network and pid namespaces, and user.
// A connection offers shared memory only when its peer's address is this host's, and the peer
// tries only when the identities are equal (workers in separate network namespaces are treated
// as separate hosts). What keeps a segment to its two processes is /proc's access check (same
// user, ptrace rules) and the token, not this string.
const std::string& host_identity();

// A sealed, anonymous memory file mapped shared: the bytes under a Segment, and under the
// process groups' shared-memory collectives (dist/process_group/shm_collectives.h). Another
// process of this host maps it through /proc/<pid>/fd/<fd>; nothing outlives the processes.
class Mapping {
 public:
  // A zero-filled file of `bytes`, sealed against resizing, its descriptor open until
  // close_fd(). `what` names the user in errors. Throws IoError.
  static Mapping create(size_t bytes, const char* what);
  // Maps descriptor `fd` of process `pid` if it is a sealed regular file of exactly `bytes`.
  // Throws InvalidArgumentError naming what did not match, IoError if mapping fails.
  static Mapping open(int32_t pid, int32_t fd, size_t bytes, const char* what);
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&&) = delete;
  ~Mapping();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  void close_fd();  // the peers have mapped it, or never will

 private:
  Mapping(int fd, void* base, size_t bytes) : fd_(fd), base_(base), bytes_(bytes) {}
  int fd_;
  void* base_;
  size_t bytes_;
};

// Futex waits and wake-ups on a word shared between processes. wait returns when the word is no
// longer `seen`, when woken, or after `limit`.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds limit);
void futex_wake_all(std::atomic<uint32_t>* word);

// What the connecting side sends so that its peer can map the segment.
struct Offer {
  std::string host;  // host_identity() of the creator
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t ring_bytes = 0;  // per direction
  std::string token;        // random; the segment starts with it
};

class Segment {
 public:
  // Creates a segment with rings of `ring_bytes` each (side 0). Throws IoError.
  static std::unique_ptr<Segment> create(uint64_t ring_bytes);
  // Maps the creator's segment (side 1). Throws InvalidArgumentError naming what did not match
  // (another host, no access to the creator's descriptor, a wrong token or size, a segment
  // already attached).
  static std::unique_ptr<Segment> attach(const Offer& offer);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  Offer offer() const;  // side 0, while its descriptor is open
  void close_fd();      // side 0: the peer has mapped it, or never will

  // --- writing into our ring (one writer at a time) ---
  // Copies up to `n` bytes, as many as there is room for, and publishes them; returns how many.
  // Throws IoError if the peer corrupted the ring's positions.
  size_t write(const uint8_t* data, size_t n);
  bool out_full() const;  // no room at all (any thread)
  // --- reading the peer's ring (the one reader) ---
  // The bytes ready to read, contiguous (a wrapped ring shows its first part). Throws IoError if
  // the peer corrupted the ring's positions.
  std::span<const uint8_t> readable() const;
  void consume(size_t n);

  // --- waking ---
  void notify_peer();  // rings the peer's bell if it sleeps
  void notify_self();  // rings our own bell if we sleep (a writer left work for our thread)
  void wake_self();    // rings our bell unconditionally (closing)
  // Sleeps on our bell until rung, `ready()` is true, or `limit` passes (our flag is set around).
  void sleep(const std::function<bool()>& ready, std::chrono::milliseconds limit);
  bool peer_sleeping() const;  // the peer's flag (tests wait for it)

 private:
  struct Control;
  Segment(Mapping mapping, int side, uint64_t ring_bytes);
  uint8_t* ring(int direction) const;
  void ring_bell(int side);

  Mapping mapping_;  // side 0 keeps its descriptor until close_fd()
  int side_;
  uint64_t ring_bytes_;
  Control* control_;
  // Our own positions (the shared copies are what the peer reads).
  uint64_t tail_ = 0;  // of our ring
  uint64_t head_ = 0;  // of the peer's ring
};

}  // namespace gw::rpc::shm
