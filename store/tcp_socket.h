// TcpSocket: a connected, non-blocking TCP socket, optionally under TLS, whose every call takes
// a deadline.
//
// TCPStore's client side uses it so that a server that died or hangs surfaces as
// gw::IoError ("connection to host:port lost") or gw::TimeoutError, never as a hang; tests use
// it to talk raw bytes to the server.
//
//   auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
//   TcpSocket s = TcpSocket::connect("127.0.0.1", 29500, deadline, "TCPStore");
//   s.send_all({header, body}, deadline, "TCPStore::set");
//   Bytes reply = s.recv_exact(4, deadline, "TCPStore::set");
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "store/store.h"
#include "store/tls.h"

namespace gw::store::detail {

using Clock = std::chrono::steady_clock;

class TcpSocket {
 public:
  // Connects with TCP_NODELAY, retrying with backoff until `deadline` because the server may
  // start later than its clients; throws gw::TimeoutError naming the address and last error.
  // `server_was_up`: the server answered before, so a refused connection means it is gone:
  // gw::IoError at once.
  static TcpSocket connect(const std::string& host, uint16_t port, Clock::time_point deadline,
                           const char* op, bool server_was_up = false);

  TcpSocket(TcpSocket&& other) noexcept;
  TcpSocket& operator=(TcpSocket&& other) noexcept;
  ~TcpSocket();

  // Writes all buffers (one gathered write where the kernel allows it).
  void send_all(std::initializer_list<const Bytes*> buffers, Clock::time_point deadline,
                const char* op);
  // Reads exactly `n` bytes; the peer closing first is a gw::IoError.
  Bytes recv_exact(size_t n, Clock::time_point deadline, const char* op);
  // Runs the TLS client handshake (store/tls.h); from then on every byte goes through TLS.
  void start_tls(const TlsContext& tls, Clock::time_point deadline, const char* op);
  // The TLS session's channel binding; all zeros before start_tls.
  auth::ChannelBinding channel_binding() const;

 private:
  TcpSocket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  // Waits until the socket is ready for `events`; throws gw::TimeoutError at the deadline.
  void wait_ready(short events, Clock::time_point deadline, const char* op);
  TlsSession::Wait tls_wait(Clock::time_point deadline, const char* op);
  [[noreturn]] void throw_lost(const char* op, int err) const;

  int fd_ = -1;
  std::string peer_;  // "host:port", for messages
  std::unique_ptr<TlsSession> tls_;
};

}  // namespace gw::store::detail
