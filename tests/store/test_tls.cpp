// TLS on TCPStore connections (store/tls.h), over real sockets on loopback: the options'
// checks, a store serving its CA's clients and no one else, and what a recording relay between
// client and server sees on the wire. Certificates come from throwaway CAs (tests/tls_pki.h).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "store/socket_stream.h"
#include "store/tcp_store.h"
#include "tests/tls_pki.h"

using namespace gw;
using namespace gw::store;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

TCPStoreOptions master_options(const TlsOptions& tls) {
  TCPStoreOptions o;
  o.port = 0;
  o.is_master = true;
  o.timeout = 5s;
  o.tls = tls;
  return o;
}

TCPStoreOptions client_options(uint16_t port, const TlsOptions& tls) {
  TCPStoreOptions o;
  o.port = port;
  o.timeout = 5s;
  o.tls = tls;
  return o;
}

// Relays connections from its port on 127.0.0.1 to `target`'s, recording every byte both ways.
class RecordingRelay {
 public:
  explicit RecordingRelay(uint16_t target) : target_(target) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), len) == 0);
    REQUIRE(::listen(listener_, 8) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~RecordingRelay() {
    ::shutdown(listener_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);  // ends every pump
    for (auto& t : pumps_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  std::string recorded() {
    std::lock_guard lock(mu_);
    return recorded_;
  }

 private:
  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
  }
  void accept_loop() {
    for (;;) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in t = loopback(target_);
      if (::connect(server, reinterpret_cast<const sockaddr*>(&t), sizeof t) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { pump(client, server); });
      pumps_.emplace_back([this, client, server] { pump(server, client); });
    }
  }
  void pump(int from, int to) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(from, buf, sizeof buf, 0);
      if (n <= 0) break;
      {
        std::lock_guard lock(mu_);
        recorded_.append(buf, static_cast<size_t>(n));
      }
      if (::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  uint16_t target_, port_ = 0;
  int listener_ = -1;
  std::thread acceptor_;
  std::vector<int> fds_;  // acceptor thread, then the destructor
  std::vector<std::thread> pumps_;
  std::mutex mu_;
  std::string recorded_;
};

}  // namespace

TEST_CASE("TLS options are checked: all three files, readable, private, matching", "[store][tls]") {
  gw::test::Pki pki;
  const TlsOptions a = pki.issue("a"), b = pki.issue("b");
  CHECK(make_tls_context({}, "test") == nullptr);  // TLS off
  CHECK(make_tls_context(a, "test") != nullptr);
  CHECK_THROWS_WITH(make_tls_context({a.cert_file, a.key_file, ""}, "TCPStore"),
                    Contains("[TCPStore] TLS needs a certificate, its key and the job's CA") &&
                        Contains("ca_file ''"));
  CHECK_THROWS_WITH(make_tls_context({a.cert_file, b.key_file, a.ca_file}, "test"),
                    Contains("cannot use TLS key '" + b.key_file + "'") && Contains("mismatch"));
  CHECK_THROWS_WITH(make_tls_context({a.cert_file + ".missing", a.key_file, a.ca_file}, "test"),
                    Contains("cannot use TLS certificate '" + a.cert_file + ".missing'"));
  {
    const std::string garbage = (pki.dir() / "garbage.pem").string();
    std::ofstream(garbage) << "not a certificate\n";
    CHECK_THROWS_WITH(make_tls_context({a.cert_file, a.key_file, garbage}, "test"),
                      Contains("cannot use TLS CA file '" + garbage + "'"));
  }
  ::chmod(a.key_file.c_str(), 0644);
  CHECK_THROWS_WITH(make_tls_context(a, "test"), Contains("chmod 600") && Contains(a.key_file));
  ::chmod(a.key_file.c_str(), 0600);
  // From the environment when the options name nothing; a partial environment is named.
  ::setenv(kTlsCertEnv, b.cert_file.c_str(), 1);
  CHECK_THROWS_WITH(make_tls_context({}, "test"), Contains("the environment give"));
  ::setenv(kTlsKeyEnv, b.key_file.c_str(), 1);
  ::setenv(kTlsCaEnv, b.ca_file.c_str(), 1);
  CHECK(make_tls_context({}, "test") != nullptr);
  for (const char* v : {kTlsCertEnv, kTlsKeyEnv, kTlsCaEnv}) ::unsetenv(v);
}

TEST_CASE("a TCPStore over TLS serves its CA's clients and no one else", "[store][tls]") {
  gw::test::Pki pki, other;
  TCPStore master("127.0.0.1", master_options(pki.issue("master")));
  TCPStore client("127.0.0.1", client_options(master.port(), pki.issue("client")));
  client.set("k", "v");
  CHECK(master.get_string("k") == "v");
  CHECK(client.add("n", 2) == 2);
  client.wait({"k", "n"});
  const int64_t keys = master.num_keys();

  const auto deadline = std::chrono::steady_clock::now() + 5s;
  // Without TLS: the server reads its plaintext hello as a broken TLS record and closes.
  CHECK_THROWS_AS(store::detail::connect_store("127.0.0.1", master.port(), JobKey::none(), nullptr,
                                               deadline, "test"),
                  IoError);
  // A certificate from another CA: each side refuses the other's.
  CHECK_THROWS_WITH(
      store::detail::connect_store("127.0.0.1", master.port(), JobKey::none(),
                                   make_tls_context(other.issue("x"), "test"), deadline, "test"),
      Contains("TLS handshake") && Contains("certificate"));
  // A client trusting the job's CA but holding another's certificate, or none: the server
  // refuses it (TLS 1.3 says so after the client's handshake, as an alert), once, no retry.
  TlsOptions foreign = other.issue("y");
  foreign.ca_file = pki.issue("unused").ca_file;
  CHECK_THROWS_AS(store::detail::connect_store("127.0.0.1", master.port(), JobKey::none(),
                                               make_tls_context(foreign, "test"), deadline, "test"),
                  TlsRefusedError);
  auto no_certificate = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  no_certificate->load_verify_file(foreign.ca_file);
  no_certificate->set_verify_mode(asio::ssl::verify_peer);
  CHECK_THROWS_AS(store::detail::connect_store("127.0.0.1", master.port(), JobKey::none(),
                                               no_certificate, deadline, "test"),
                  TlsRefusedError);
  // A TLS client asking a plaintext store gets no answer it could mistake for one: the store
  // closes on it, which is a lost connection (tried again), not a refusal.
  TCPStore plain("127.0.0.1", master_options({}));
  try {
    TCPStore("127.0.0.1", client_options(plain.port(), pki.issue("c2")));
    FAIL("a TLS client talked to a plaintext store");
  } catch (const TlsRefusedError& e) {
    FAIL("a closed connection was taken for a TLS refusal: " << e.what());
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Contains("4 attempts"));
  }
  CHECK(master.num_keys() == keys);
}

TEST_CASE("both ends of one TLS session share its channel binding; another session has another",
          "[store][tls]") {
  gw::test::Pki pki;
  const TlsContext ctx = make_tls_context(pki.issue("node"), "test");
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  // One TLS session over loopback: both ends' bindings, {server, client}.
  auto session = [&](const TlsContext& tls) {
    Stream server(asio::ip::tcp::socket(io), tls), client(asio::ip::tcp::socket(io), tls);
    std::error_code server_ec = asio::error::would_block, client_ec = asio::error::would_block;
    acceptor.async_accept(server.socket(), [&](const std::error_code& ec) {
      if (ec)
        server_ec = ec;
      else
        server.async_tls_handshake(asio::ssl::stream_base::server,
                                   [&](const std::error_code& e) { server_ec = e; });
    });
    client.socket().async_connect(acceptor.local_endpoint(), [&](const std::error_code& ec) {
      if (ec)
        client_ec = ec;
      else
        client.async_tls_handshake(asio::ssl::stream_base::client,
                                   [&](const std::error_code& e) { client_ec = e; });
    });
    io.restart();
    io.run_for(10s);
    REQUIRE(!server_ec);
    REQUIRE(!client_ec);
    return std::pair{server.channel_binding(), client.channel_binding()};
  };
  const auto [server, client] = session(ctx);
  CHECK(server == client);
  CHECK(server != auth::ChannelBinding{});
  CHECK(session(ctx).first != server);  // a relay would hold two sessions: two bindings
  CHECK(session(nullptr).first == auth::ChannelBinding{});  // plain TCP: none
}

TEST_CASE("on the wire, a TLS store's traffic is unreadable; a plain one's is not",
          "[store][tls]") {
  gw::test::Pki pki;
  const std::string secret = "gradwire-secret-value-0123456789abcdef";
  for (const bool tls : {false, true}) {
    INFO("TLS " << tls);
    const TlsOptions server_tls = tls ? pki.issue("master") : TlsOptions{};
    const TlsOptions client_tls = tls ? pki.issue("client") : TlsOptions{};
    TCPStore master("127.0.0.1", master_options(server_tls));
    RecordingRelay relay(master.port());
    {
      TCPStore client("127.0.0.1", client_options(relay.port(), client_tls));
      client.set("secret-key", secret);
      CHECK(client.get_string("secret-key") == secret);  // through the relay and back
    }
    CHECK(master.get_string("secret-key") == secret);
    const std::string wire = relay.recorded();
    CHECK(wire.size() > secret.size());
    // The control run proves the relay sees plaintext when there is plaintext to see.
    CHECK((wire.find(secret) != std::string::npos) == !tls);
    CHECK((wire.find("secret-key") != std::string::npos) == !tls);
  }
}
