// One TCP connection between two RPC agents, carrying frames (see message.h and wire.capnp).
//
// Reading runs on the agent's Asio thread through a FrameReader (rpc/frame_reader.h): small
// frames are parsed out of a 64 KiB buffer, and large tensor payloads are read straight into
// newly allocated tensor storage. Everything the peer claims (sizes, counts, indices) is
// validated before it is used; a bad frame closes this connection only. Writing is done by the
// sending thread itself with one gathered sendmsg() on the socket (no copy of tensor bytes, no hop
// to another thread); only when the kernel's buffer is full does the rest wait for the Asio thread.
// Under TLS (dist/store/tls.h), whose session is not for concurrent use, the Asio thread does
// all the writing: a sender queues its frame, and the queue goes out in gathered batches.
// `send` is thread-safe.
//
// Liveness (dist/store/liveness.h) is the transport's: it asks each connection when it last
// heard from its peer (any bytes, heartbeats included) and when it last sent, and makes it
// send a heartbeat — an empty frame the reader drops — when it has sent nothing for a while.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <asio.hpp>

#include "dist/store/stream.h"
#include "rpc/frame_reader.h"
#include "rpc/message.h"

namespace gw::rpc {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = std::chrono::steady_clock;
  using MessageHandler = std::function<void(const std::shared_ptr<Connection>&, Message)>;
  using CloseHandler = std::function<void(const std::shared_ptr<Connection>&, const std::string&)>;

  // `stream` is connected, its handshakes done.
  Connection(dist::Stream stream, uint64_t max_frame_bytes, MessageHandler on_message,
             CloseHandler on_close);
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
  // When bytes last arrived from the peer (Asio thread; the connection's creation at first).
  Clock::time_point last_heard() const { return last_heard_; }
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
  // Writes as much of the queue as the socket takes now; caller holds write_mu_. Returns
  // false on a socket error (then the connection is being closed).
  bool write_queued_locked();
  // Queues `p` and writes what the socket takes now; caller holds write_mu_, the connection open.
  void enqueue_locked(std::unique_ptr<Pending> p);
  void wait_writable();
  void write_tls();  // Asio thread
  void close_on_io_thread(const std::string& why);

  dist::Stream stream_;
  asio::ip::tcp::socket& socket_ = stream_.socket();
  const int fd_;
  const uint64_t max_frame_bytes_;
  MessageHandler on_message_;
  CloseHandler on_close_;
  std::string remote_;
  std::atomic<int> peer_id_{-1};
  std::atomic<bool> closed_{false};

  // Read state, touched only by the Asio thread.
  Clock::time_point last_heard_ = Clock::now();
  std::vector<uint8_t> buf_;
  FrameReader reader_;

  // Write state.
  std::atomic<Clock::rep> last_sent_{Clock::now().time_since_epoch().count()};
  std::mutex write_mu_;
  std::deque<std::unique_ptr<Pending>> queue_;
  // The Asio thread owns the writing: plain, it waits for the socket to take more; TLS, a
  // write_tls() is scheduled or in flight.
  bool waiting_writable_ = false;
  bool close_started_ = false;
  std::deque<std::unique_ptr<Pending>> writing_;  // TLS: the batch being written (Asio thread)
};

}  // namespace gw::rpc
