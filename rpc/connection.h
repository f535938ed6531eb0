// One connection between two RPC agents, carrying frames (see message.h and wire.capnp): a TCP
// socket, and between workers on one host a shared-memory segment beside it (below).
//
// Reading runs on the agent's Asio thread through a FrameReader (rpc/frame_reader.h): small
// frames are parsed out of a 64 KiB buffer, and large tensor payloads are read straight into
// newly allocated tensor storage. Everything the peer claims (sizes, counts, indices) is
// validated before it is used; a bad frame closes this connection only. Writing is done by the
// sending thread itself with one gathered sendmsg() on the socket (no copy of tensor bytes, no hop
// to another thread); only when the kernel's buffer is full does the rest wait for the Asio thread.
// Under TLS (store/tls.h), whose session is not for concurrent use, the Asio thread does
// all the writing: a sender queues its frame, and the queue goes out in gathered batches.
// `send` is thread-safe.
//
// Liveness (store/liveness.h) is the transport's: it asks each connection when it last
// heard from its peer (any bytes, heartbeats included) and when it last sent, and makes it
// send a heartbeat — an empty frame the reader drops — when it has sent nothing for a while.
//
// Shared memory (rpc/shm.h). When both ends are on one host, frames go through a shared
// segment instead of the socket, negotiated in-band so that no frame overtakes another:
//   opener:   Handshake{offer} ... (socket)           reads the socket until kAccept, then the ring
//   accepter: maps the segment, Handshake{kAccept}    writes to the ring from then on
//   opener:   Handshake{kSwitch}                      writes to the ring from then on
//   accepter: reads the socket until kSwitch, then the ring
// A decline (another host, no access, shared memory off) leaves both on the socket. Either
// way the socket stays open and read, so that a peer that dies is seen as fast as over TCP.
// Between two processes of one host (shared memory set up), CUDA tensors go by IPC handle
// (core/ipc.h): a frame shares them under a lease that this end keeps until the peer's release
// says it has copied them, or until the peer closes; closed from this end, until the peer's
// process is gone, since a copy of it may be under way.
// The ring is read by the connection's own ring thread, which also writes what a sender left
// when the ring was full; it spins briefly after its last work, then sleeps on a futex (no
// core is kept busy). Message handlers then run on that thread (the transport runs one handler
// at a time, whichever thread delivers). When the peer closes its socket, what it wrote into
// the ring before is still delivered, as TCP delivers what came before a FIN.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <asio.hpp>

#include "rpc/frame_reader.h"
#include "rpc/message.h"
#include "rpc/shm.h"
#include "store/socket_stream.h"

namespace gw::rpc {

// The threads connections run for their shared memory, counted so that their owner can wait
// for every one to end (they end once their connection is closed).
class ThreadCount {
 public:
  void add();
  void done();
  void wait_none();
  bool counts_this_thread() const;  // this is one of the threads counted

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int live_ = 0;
};

struct ShmOptions {
  uint64_t ring_bytes = 0;  // per direction; 0: neither offer nor accept shared memory
  std::function<void()> on_thread_start;  // runs first on a ring thread
  std::shared_ptr<ThreadCount> threads;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = std::chrono::steady_clock;
  using MessageHandler = std::function<void(const std::shared_ptr<Connection>&, Message)>;
  using CloseHandler = std::function<void(const std::shared_ptr<Connection>&, const std::string&)>;

  // `stream` is connected, its handshakes done.
  Connection(store::Stream stream, uint64_t max_frame_bytes, MessageHandler on_message,
             CloseHandler on_close, ShmOptions shm = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts the read loop; call once, from any thread.
  void start();
  // Queues `m` for the peer; throws IoError if the connection is closed, InvalidArgumentError
  // if `m` is larger than max_frame_bytes (which the peer would refuse).
  void send(const Message& m);
  // Closes the socket (from any thread); the close handler runs once, with `why`.
  void close(const std::string& why);
  // Queues a heartbeat unless a frame is already waiting to go out (any thread).
  void send_heartbeat();
  // The opener, before start() and before sending `hello` (its Handshake): offers shared
  // memory in it, if the options allow and the connection is not under TLS. Never throws: a
  // segment that cannot be made is not offered.
  void offer_shm(Message& hello);
  // "shm" once frames go both ways through shared memory, else "tcp".
  const char* link() const;

  // When bytes last arrived from the peer (the connection's creation at first); now while the
  // ring thread runs a handler, since it reads nothing meanwhile.
  Clock::time_point last_heard() const {
    if (in_handler_.load(std::memory_order_acquire) && !peer_closed_.load()) return Clock::now();
    return Clock::time_point(Clock::duration(last_heard_.load(std::memory_order_relaxed)));
  }
  // When a frame was last queued to the peer (any thread).
  Clock::time_point last_sent() const {
    return Clock::time_point(Clock::duration(last_sent_.load(std::memory_order_relaxed)));
  }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // The peer's address, "ip:port".
  const std::string& remote() const { return remote_; }
  // Who is on the other side, once the handshake has told us (-1 before).
  int peer_id() const { return peer_id_.load(std::memory_order_acquire); }
  void set_peer_id(int id) { peer_id_.store(id, std::memory_order_release); }

 private:
  struct Pending;  // a frame the kernel has not fully taken yet

  void read_more();
  void on_read(const std::error_code& ec, size_t n, bool direct);
  void deliver();  // the message the reader completed, if any
  // Asio thread: a shared-memory step from the peer; true if `m` is for the agent too.
  bool on_shm_step(Message& m);
  class Receipt;
  // Either reading thread: takes a release of our leases (false: not for the agent), or gives a
  // message that brings shared CUDA tensors its Receipt. Throws IoError if the peer may not
  // share.
  bool on_cuda_ipc(Message& m);
  // Asio thread, once shared memory is set up: the peer is process `pid` of this host (IoError
  // for a pid no process has); CUDA tensors may go by IPC handle to another process.
  void on_peer_process(int32_t pid);
  // Keeps what we shared until the peer's process is gone.
  static void keep_leases(std::map<uint64_t, CudaIpcLease> leases,
                          std::shared_ptr<const CudaIpcPeer> peer);
  void start_ring_thread();  // Asio thread
  void ring_loop();          // ring thread
  bool read_ring();          // ring thread: what the ring holds; false if nothing
  // Writes as much of shm_queue_ as the ring takes now (whether anything); caller holds
  // write_mu_. Throws IoError if the peer corrupted the ring.
  bool write_ring_locked();
  // Writes as much of the queue as the socket takes now; caller holds write_mu_. Returns
  // false on a socket error (then the connection is being closed).
  bool write_queued_locked();
  // Queues `p` and writes what the socket takes now; caller holds write_mu_, the connection open.
  void enqueue_locked(std::unique_ptr<Pending> p);
  void wait_writable();
  void write_tls();  // Asio thread
  void close_on_io_thread(const std::string& why);

  store::Stream stream_;
  asio::ip::tcp::socket& socket_ = stream_.socket();
  const int fd_;
  const uint64_t max_frame_bytes_;
  MessageHandler on_message_;
  CloseHandler on_close_;
  std::string remote_;
  std::atomic<int> peer_id_{-1};
  std::atomic<bool> closed_{false};

  // Read state, touched only by the Asio thread.
  std::atomic<Clock::rep> last_heard_{Clock::now().time_since_epoch().count()};
  std::vector<uint8_t> buf_;
  FrameReader reader_;

  // Shared memory. shm_ is set on the Asio thread before shm_out_ or the ring thread use it,
  // and lives as long as the connection.
  const ShmOptions shm_options_;
  std::unique_ptr<shm::Segment> shm_;
  bool shm_offered_ = false;             // Asio thread
  std::atomic<bool> shm_in_{false};      // the ring thread reads frames from the ring
  std::atomic<bool> shm_queued_{false};  // shm_queue_ waits for room in the ring
  // The peer closed the socket after switching: the ring thread hands on what the ring still
  // holds, then closes with peer_closed_why_ (written before the flag).
  std::atomic<bool> peer_closed_{false};
  std::string peer_closed_why_;
  asio::steady_timer drain_limit_;  // Asio thread: closes anyway should the ring thread be held
  // The ring thread runs on_message_ (or waits to: handlers run one at a time).
  std::atomic<bool> in_handler_{false};
  FrameReader ring_reader_;              // ring thread

  // Write state.
  std::atomic<Clock::rep> last_sent_{Clock::now().time_since_epoch().count()};
  mutable std::mutex write_mu_;
  std::deque<std::unique_ptr<Pending>> queue_;
  // The Asio thread owns the writing: plain, it waits for the socket to take more; TLS, a
  // write_tls() is scheduled or in flight.
  bool waiting_writable_ = false;
  bool close_started_ = false;
  bool shm_out_ = false;  // frames go into the ring, through shm_queue_
  std::deque<std::unique_ptr<Pending>> shm_queue_;
  std::deque<std::unique_ptr<Pending>> writing_;  // TLS: the batch being written (Asio thread)
  // CUDA IPC: set once shared memory shows the peer is another process of this host.
  std::atomic<bool> cuda_ipc_{false};
  std::atomic<int32_t> peer_pid_{0};             // set before cuda_ipc_ (Asio thread)
  std::shared_ptr<const CudaIpcPeer> ipc_peer_;  // under write_mu_: made with the first lease
  // Copies out of the peer's memory hold it shared; closing takes it, so that none runs after.
  std::shared_mutex copying_mu_;
  std::atomic<uint64_t> last_lease_{0};
  std::map<uint64_t, CudaIpcLease> leases_;  // under write_mu_
};

}  // namespace gw::rpc
