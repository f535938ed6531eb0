// The server half of TCPStore: a map served over TCP by one background thread (Asio).
//
// Rank 0's TCPStore owns one; everything else, including rank 0's own requests, goes through
// the client side in tcp_store.cpp. `get`/`wait` requests whose keys are missing are parked and
// answered when the keys appear or the timeout sent with the request passes, so clients never
// poll the network. A connection is served only once its client proved the job key
// (store/handshake.h), within the handshake timeout; before that nothing it sends is read
// beyond the handshake's fixed-size messages.
//
//   detail::TCPStoreServer server("127.0.0.1", options, key);  // options.port 0: a free port
//   uint16_t port = server.port();        // tell the clients
//   // ~TCPStoreServer stops the thread and closes every connection
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "store/tcp_store.h"

namespace gw::store::detail {

class TCPStoreServer {
 public:
  // Listens on `address` (an IP address), port `options.port`, before returning; throws
  // gw::IoError naming them if it cannot (e.g. the port is in use). Clients must prove `key`,
  // under TLS when `tls` is set.
  TCPStoreServer(const std::string& address, const TCPStoreOptions& options, const JobKey& key,
                 const TlsContext& tls);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const;

  class Impl;  // in the .cpp, so Asio stays out of this header

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::store::detail
