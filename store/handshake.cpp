#include "store/handshake.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/log.h"

namespace gw::store::auth {
namespace {

// One handshake in flight: its stream, messages and deadline, kept alive by its callbacks.
struct Run : std::enable_shared_from_this<Run> {
  Run(std::shared_ptr<Stream> stream, std::chrono::milliseconds timeout, HandshakeDone callback)
      : s(std::move(stream)), timer(s->get_executor()), done(std::move(callback)) {
    timer.expires_after(timeout);
    // Every message of the handshakes is answered: none may wait for Nagle's algorithm.
    std::error_code ignored;
    s->socket().set_option(asio::ip::tcp::no_delay(true), ignored);
  }

  void start_timer() {
    timer.async_wait([self = shared_from_this()](const std::error_code& ec) {
      if (ec || self->finished) return;
      self->timed_out = true;
      std::error_code ignored;
      self->s->close(ignored);  // aborts the pending read, write or TLS handshake
    });
  }

  // The TLS handshake as `side` (at once on a plain stream), then `next`.
  template <typename Next>
  void tls(asio::ssl::stream_base::handshake_type side, Next next) {
    s->async_tls_handshake(
        side, [self = shared_from_this(), next = std::move(next)](
                  const std::error_code& ec) mutable { self->then(std::move(next))(ec, 0); });
  }
  // Reads (writes) all of `b`, then runs `next`; an I/O error or a throw from `next` ends the
  // handshake, failed.
  template <typename Next>
  void read(asio::mutable_buffer b, Next next) {
    asio::async_read(*s, b, then(std::move(next)));
  }
  template <typename Next>
  void write(asio::const_buffer b, Next next) {
    asio::async_write(*s, b, then(std::move(next)));
  }
  template <typename Next>
  auto then(Next next) {
    return [self = shared_from_this(), next = std::move(next)](const std::error_code& ec,
                                                               size_t) mutable {
      if (ec) return self->finish(ec);
      try {
        next();
      } catch (...) {
        self->finish({}, std::current_exception());
      }
    };
  }

  void succeed(const Identity& who) {
    peer = who;
    finish({});
  }
  // Ends the handshake once: `ec` or `failed` says why it failed, if it did.
  void finish(const std::error_code& ec, std::exception_ptr failed = nullptr) {
    if (finished) return;
    finished = true;
    timer.cancel();
    if (timed_out)
      failed = std::make_exception_ptr(TimeoutError("[handshake] not completed in time"));
    else if (ec)
      failed = std::make_exception_ptr(IoError(
          std::string("[handshake] ") +
          (ec.category() == asio::error::get_ssl_category() ? "TLS: " : "") + ec.message()));
    done(failed, peer);
  }

  std::shared_ptr<Stream> s;
  asio::steady_timer timer;
  HandshakeDone done;
  bool finished = false, timed_out = false;
  Identity claimed, peer;  // peer: once proven
  Hello hello{};
  Challenge challenge{};
  Proof proof{};
  std::optional<ServerHandshake> server;
  std::optional<ClientHandshake> client;
};

}  // namespace

void async_accept(std::shared_ptr<Stream> s, const JobKey& key, Purpose purpose, Identity self,
                  std::chrono::milliseconds timeout, HandshakeDone done) {
  auto run = std::make_shared<Run>(std::move(s), timeout, std::move(done));
  run->start_timer();
  run->tls(asio::ssl::stream_base::server, [run, key, purpose, self = std::move(self)] {
    run->server.emplace(key, purpose, self, run->s->channel_binding());
    run->read(asio::buffer(run->hello), [run] {
      run->claimed = run->server->read_hello(run->hello);
      run->write(asio::buffer(run->server->challenge()), [run] {
        run->read(asio::buffer(run->proof), [run] {
          run->server->check_proof(run->proof);
          run->succeed(run->claimed);
        });
      });
    });
  });
}

void async_connect(std::shared_ptr<Stream> s, const JobKey& key, Purpose purpose, Identity self,
                   Identity expected, std::chrono::milliseconds timeout, HandshakeDone done) {
  auto run = std::make_shared<Run>(std::move(s), timeout, std::move(done));
  run->claimed = std::move(expected);
  run->start_timer();
  run->tls(asio::ssl::stream_base::client, [run, key, purpose, self = std::move(self)] {
    run->client.emplace(key, purpose, self, run->s->channel_binding());
    run->write(asio::buffer(run->client->hello()), [run] {
      run->read(asio::buffer(run->challenge), [run] {
        run->proof = run->client->answer(run->challenge, run->claimed);
        run->write(asio::buffer(run->proof), [run] { run->succeed(run->claimed); });
      });
    });
  });
}

void RefusalLog::refused(const std::string& address, const std::string& why) {
  constexpr size_t kMaxListed = 1024;
  {
    std::lock_guard lock(mu_);
    if (logged_.contains(address)) return;
    if (logged_.size() < kMaxListed) {
      logged_.insert(address);
    } else if (const uint64_t n = ++unlisted_; (n & (n - 1)) != 0) {
      return;
    }
  }
  log_error(who_, ": refused a connection from ", address, ": ", why, " (logged once per address)");
}

namespace {
// Who a connection comes from, for eviction: its IP address, an IPv6 one by its /64 (one host
// commonly holds a whole /64).
std::string source_of(const std::string& address) {
  std::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec || !ip.is_v6() || ip.to_v6().is_v4_mapped()) return address;
  auto bytes = ip.to_v6().to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return asio::ip::address_v6(bytes).to_string() + "/64";
}
}  // namespace

Gatekeeper::Gatekeeper(asio::ip::tcp::acceptor& acceptor, Options options, Admit admit)
    : acceptor_(acceptor),
      options_(std::move(options)),
      admit_(std::move(admit)),
      retry_(acceptor.get_executor()),
      refusals_(options_.who) {
  GW_CHECK(options_.max_unauthenticated > 0 && options_.handshake_timeout.count() > 0,
           InvalidArgumentError, "[", options_.who, "] max_unauthenticated_connections (",
           options_.max_unauthenticated, ") and handshake_timeout (",
           options_.handshake_timeout.count(), " ms) must be positive");
}

void Gatekeeper::start() { accept(); }

void Gatekeeper::stop() {
  stopped_ = true;
  std::error_code ignored;
  acceptor_.close(ignored);
  retry_.cancel();
  for (auto& [s, from] : pending_) s->close(ignored);  // their handshakes end, aborted
  pending_.clear();
}

void Gatekeeper::accept() {
  acceptor_.async_accept([this](const std::error_code& ec, asio::ip::tcp::socket s) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or similar: back off and retry, never give up.
      if (!failure_logged_)
        log_error(options_.who, ": accepting a connection failed (", ec.message(),
                  "); retrying with backoff (logged once)");
      failure_logged_ = true;
      backoff_ =
          std::clamp(backoff_ * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
      retry_.expires_after(backoff_);
      retry_.async_wait([this](const std::error_code& e) {
        if (!e && !stopped_) accept();
      });
      return;
    }
    backoff_ = std::chrono::milliseconds(0);
    accept();  // first: a failure below must not stop the acceptor
    try {
      handshake(std::move(s));
    } catch (const std::exception& e) {
      log_error(options_.who, ": could not start a handshake: ", e.what());
    }
  });
}

void Gatekeeper::handshake(asio::ip::tcp::socket socket) {
  auto s = std::make_shared<Stream>(std::move(socket), options_.tls);
  std::string from = peer_address(*s);
  if (pending_.size() >= static_cast<size_t>(options_.max_unauthenticated)) {
    // The oldest connection of the busiest source (ties: the oldest of all), so that a flood
    // evicts its own first and a fresh connection outlives `max_unauthenticated` more accepts.
    std::map<std::string, size_t> per_source;
    size_t most = 0;
    for (const auto& p : pending_) most = std::max(most, ++per_source[source_of(p.second)]);
    const auto victim = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) {
      return per_source[source_of(p.second)] == most;
    });
    refusals_.refused(victim->second, gw::detail::str("closed unauthenticated: ", pending_.size(),
                                                      " connections were proving the job key "
                                                      "(max_unauthenticated_connections)"));
    std::error_code ignored;
    victim->first->close(ignored);  // its handshake ends, aborted
    pending_.erase(victim);
  }
  pending_.emplace_back(s, from);
  async_accept(s, options_.key, options_.purpose, options_.self, options_.handshake_timeout,
               [this, s, from](std::exception_ptr failed, const Identity& peer) {
                 std::erase_if(pending_, [&](const auto& p) { return p.first == s; });
                 if (stopped_) return;
                 // (Evicted just as it succeeded: its socket is closed, nothing to admit.)
                 if (!failed) return s->is_open() ? admit_(s, peer, from) : void();
                 try {
                   std::rethrow_exception(failed);
                 } catch (const std::exception& e) {
                   refusals_.refused(from, e.what());
                 }
               });
}

std::error_code listen(asio::ip::tcp::acceptor& acceptor, const asio::ip::address& ip,
                       uint16_t port) {
  const asio::ip::tcp::endpoint ep(ip, port);
  std::error_code ec;
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  return ec;
}

std::string peer_address(const Stream& s) {
  std::error_code ec;
  const auto ep = s.socket().remote_endpoint(ec);
  return ec ? "?" : ep.address().to_string();
}

}  // namespace gw::store::auth
