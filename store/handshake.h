// The handshakes that open a connection, run on a Stream (store/socket_stream.h): asynchronously,
// on the stream's executor, within one deadline — TLS first when the stream has it, then the
// job-key handshake (store/job_key.h) bound to the TLS session. The TCPStore server and
// the RPC transport open every connection with them; nothing else is read from a stream before
// they succeed.
//
//   auto s = std::make_shared<Stream>(std::move(accepted), tls);  // tls: null for plain TCP
//   auth::async_accept(s, key, auth::Purpose::kRpc, {"worker1", 1}, 10s,
//                      [s](std::exception_ptr failed, const auth::Identity& peer) {
//                        if (!failed) serve(std::move(*s), peer);  // peer holds the key
//                      });
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <asio.hpp>

#include "store/job_key.h"
#include "store/socket_stream.h"

namespace gw::store::auth {

// Runs once, on the socket's executor: `failed` is null and `peer` proven, or `failed` says why
// (IoError; TimeoutError after `timeout`, which also closes the socket). A failed TLS
// handshake (a peer without a certificate from the job's CA) is an IoError saying so.
using HandshakeDone = std::function<void(std::exception_ptr failed, const Identity& peer)>;

// The server's side, on an accepted socket.
void async_accept(std::shared_ptr<Stream> s, const JobKey& key, Purpose purpose, Identity self,
                  std::chrono::milliseconds timeout, HandshakeDone done);
// The client's side, on a connected socket; the server must prove it is `expected`.
void async_connect(std::shared_ptr<Stream> s, const JobKey& key, Purpose purpose, Identity self,
                   Identity expected, std::chrono::milliseconds timeout, HandshakeDone done);

// Logs refused connections once per peer address (the first 1024 addresses; beyond them, at
// the 1st, 2nd, 4th, ... refusal), so that a flood cannot flood the log. Thread-safe.
class RefusalLog {
 public:
  explicit RefusalLog(std::string who) : who_(std::move(who)) {}
  void refused(const std::string& address, const std::string& why);

 private:
  const std::string who_;
  std::mutex mu_;
  std::set<std::string> logged_;
  uint64_t unlisted_ = 0;
};

// A listener's door: accepts connections for as long as its acceptor is open and hands over
// only those whose peer proved the job key. Each accepted socket runs the handshake within
// `handshake_timeout`; at most `max_unauthenticated` do so at once, and one more closes the
// oldest of those from the busiest source address (an IPv6 /64; ties: the oldest of all). A
// flood from elsewhere thus evicts its own connections, and a real peer's, which completes its
// handshake in a round trip, outlives `max_unauthenticated` further accepts. Should
// accepting fail (out of descriptors: EMFILE, ENFILE), it logs once, backs off and retries.
// Refusals are logged once per peer address. Everything runs on the acceptor's executor:
// start() and stop() too.
//
//   Gatekeeper door(acceptor, {key, Purpose::kStore, {"store", -1}, 10s, 64, "TCPStore"},
//                   [](std::shared_ptr<Stream> s, const Identity& peer, const std::string& from) {
//                     serve(std::move(*s));
//                   });
//   door.start();  ...  door.stop();  // closes the acceptor and every pending handshake
class Gatekeeper {
 public:
  struct Options {
    JobKey key = JobKey::none();
    Purpose purpose = Purpose::kRpc;
    Identity self;
    std::chrono::milliseconds handshake_timeout{10000};
    int max_unauthenticated = 256;  // checked here: positive
    std::string who;                // the owner, for log lines: "TCPStore", "rpc worker0"
    TlsContext tls;                 // null: plain TCP
  };
  using Admit =
      std::function<void(std::shared_ptr<Stream> s, const Identity& peer, const std::string& from)>;

  Gatekeeper(asio::ip::tcp::acceptor& acceptor, Options options, Admit admit);
  void start();
  void stop();
  // Logs that the peer at `from` was refused (once per address), e.g. by the owner's admit.
  void refused(const std::string& from, const std::string& why) { refusals_.refused(from, why); }

 private:
  void accept();
  void handshake(asio::ip::tcp::socket socket);

  asio::ip::tcp::acceptor& acceptor_;
  const Options options_;
  Admit admit_;
  asio::steady_timer retry_;
  std::chrono::milliseconds backoff_{0};
  bool failure_logged_ = false;
  bool stopped_ = false;
  // Accepted, not yet proven: oldest first, with the peer's address.
  std::vector<std::pair<std::shared_ptr<Stream>, std::string>> pending_;
  RefusalLog refusals_;
};

// Opens `acceptor` on ip:port (0: an ephemeral port) and listens; the error, if any.
std::error_code listen(asio::ip::tcp::acceptor& acceptor, const asio::ip::address& ip,
                       uint16_t port);

// The peer's IP address, or "?" (a socket whose peer is gone).
std::string peer_address(const Stream& s);

}  // namespace gw::store::auth
