// TCPStore: a Store served over TCP by a server thread inside the master's process (PyTorch's
// c10d TCPStore).
//
// The master (rank 0) starts the server and is also a client of it; every other rank only
// connects, retrying until the timeout because the master may start later. `get` and `wait`
// are answered by the server when the keys appear (no polling); the client also keeps its own
// deadline, so a dead or stuck server surfaces as gw::IoError / gw::TimeoutError, never a hang.
// One object may be used from many threads: each in-flight call borrows its own connection.
//
//   gw::store::TCPStore master("127.0.0.1", 0, /*world_size=*/2, /*is_master=*/true);
//   gw::store::TCPStore worker("127.0.0.1", master.port(), 2, false);
//   worker.set("ready", "1");
//   master.wait({"ready"});
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/job_key.h"
#include "store/store.h"
#include "store/tcp_socket.h"
#include "store/tcp_store_wire.h"

namespace gw::store {

namespace detail {
class TCPStoreServer;
// A connection to the store server at host:port (under TLS when `tls` is set) on which this
// client proved `key` (and the server proved it too): what every TCPStore request goes over,
// and what tests speak raw frames on. Throws TimeoutError/IoError naming `op` (IoError at once
// when the server refuses the connection and `server_was_up`).
TcpSocket connect_store(const std::string& host, uint16_t port, const JobKey& key,
                        const TlsContext& tls, Clock::time_point deadline, const char* op,
                        bool server_was_up = false);
}  // namespace detail

struct TCPStoreOptions {
  uint16_t port = 29500;  // 0 on the master: pick a free port, read it back with port()
  int world_size = -1;    // informational, as in PyTorch (-1: unknown)
  bool is_master = false;
  Milliseconds timeout = kDefaultStoreTimeout;

  // Security (README "Security"). Every connection proves the job key first (job_key.h):
  // this one, else GW_JOB_KEY_FILE's. A master without a key refuses a non-loopback address
  // unless allow_unauthenticated (or GW_ALLOW_UNAUTHENTICATED=1).
  std::optional<JobKey> job_key;
  bool allow_unauthenticated = false;
  // Master: the address the server listens on; empty: GW_STORE_BIND_ADDRESS, else `host`'s
  // address — except that with a key, this machine's own hostname mapped to loopback (Debian's
  // 127.0.1.1) means every interface, where the other hosts can reach it. Never every
  // interface otherwise, unless asked for with "0.0.0.0".
  std::string bind_address;
  // Master: a larger request closes its connection (the default fits any legal request).
  uint32_t max_frame_bytes = detail::kMaxFrameBytes;
  // Master: a connection that has not proved the key by then is closed ...
  Milliseconds handshake_timeout{10000};
  // ... and beyond this many such connections at once, each new one closes the oldest of
  // those from the busiest address.
  int max_unauthenticated_connections = 256;
  // TLS on every connection (store/tls.h): these files, else GW_TLS_*'s; none: plain TCP.
  // The server and its clients must agree.
  TlsOptions tls;
};

class TCPStore : public Store {
 public:
  TCPStore(std::string host, const TCPStoreOptions& options);
  // PyTorch's signature: TCPStore(host, port, world_size, is_master, timeout).
  TCPStore(std::string host, uint16_t port, int world_size, bool is_master,
           Milliseconds timeout = kDefaultStoreTimeout);
  ~TCPStore() override;

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  int64_t add_within(const std::string& key, int64_t delta, Milliseconds timeout) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;

  const std::string& host() const { return host_; }
  // The server's port: the bound one when the master was created with port 0.
  uint16_t port() const { return port_; }
  int world_size() const { return world_size_; }
  bool is_master() const { return server_ != nullptr; }

 private:
  // Sends one request on an idle (or new) connection and returns the reply, status byte first.
  // A connection that failed mid-call is closed, never reused: its stream state is unknown.
  detail::ByteReader call(const char* op, const detail::ByteWriter& request,
                          detail::Clock::time_point deadline);
  // call() with the store's timeout, for requests whose only good answer is kOk.
  detail::ByteReader call_ok(const char* op, const detail::ByteWriter& request);
  detail::ByteReader call_ok(const char* op, const detail::ByteWriter& request,
                             detail::Clock::time_point deadline);
  // get/wait: the server parks the request until the keys exist or `timeout` passes.
  Bytes wait_on_server(const char* op, detail::Command cmd, const std::vector<std::string>& keys,
                       Milliseconds timeout);
  detail::Clock::time_point deadline() const { return detail::Clock::now() + timeout(); }

  std::unique_ptr<detail::TCPStoreServer> server_;  // first: destroyed after the connections
  JobKey key_;
  TlsContext tls_;  // null: plain TCP
  std::string host_;
  uint16_t port_;
  int world_size_;
  std::mutex idle_mu_;
  std::vector<detail::TcpSocket> idle_;  // connections no call is using
};

}  // namespace gw::store
