// The server half of TCPStore: a map served over TCP by one background thread (Asio).
//
// Rank 0's TCPStore owns one; everything else, including rank 0's own requests, goes through
// the client side in tcp_store.cpp. `get`/`wait` requests whose keys are missing are parked and
// answered when the keys appear or the timeout sent with the request passes, so clients never
// poll the network.
//
//   detail::TCPStoreServer server(0);    // 0: pick a free port
//   uint16_t port = server.port();        // tell the clients
//   // ~TCPStoreServer stops the thread and closes every connection
#pragma once

#include <cstdint>
#include <memory>

namespace gw::dist::detail {

class TCPStoreServer {
 public:
  // Listens on every IPv4 interface before returning; throws gw::IoError naming the port if it
  // cannot (e.g. it is in use).
  explicit TCPStoreServer(uint16_t port);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const;

  class Impl;  // in the .cpp, so Asio stays out of this header

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::dist::detail
