#include "store/tcp_store_server.h"

#include <array>
#include <asio.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "store/handshake.h"
#include "store/store_util.h"
#include "store/tcp_store_wire.h"

namespace gw::store::detail {
namespace {

using asio::ip::tcp;

constexpr const char* kWhat = "TCPStore server";
// Caps a client's wait so the timer arithmetic cannot overflow.
constexpr uint64_t kMaxWaitMs = uint64_t{365} * 24 * 3600 * 1000;

class Session;

// A get/wait whose keys were missing: answered when they all exist or when the timer fires.
struct Waiter {
  Waiter(asio::io_context& io, std::shared_ptr<Session> s, std::vector<std::string> k, bool get)
      : session(std::move(s)), keys(std::move(k)), is_get(get), timer(io) {}
  std::shared_ptr<Session> session;
  std::vector<std::string> keys;
  bool is_get;           // the reply carries the value of keys[0]
  std::string watching;  // the missing key it is registered under
  asio::steady_timer timer;
  bool done = false;
};

}  // namespace

// Everything below runs on the server thread only, so the map needs no lock.
class TCPStoreServer::Impl {
 public:
  Impl(const std::string& address, const TCPStoreOptions& options, const JobKey& key,
       const TlsContext& tls);
  void start() {
    thread_ = std::thread([this] {
      // A handler bug must not take the whole store down with std::terminate: keep serving.
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception&) {
        }
      }
    });
  }
  void stop();
  uint16_t port() const { return port_; }

  // Executes one request. Throws gw::Error for a malformed frame: the caller drops the client.
  void handle(const std::shared_ptr<Session>& session, Bytes body);
  void forget(Session* session) { sessions_.erase(session); }
  uint32_t max_frame_bytes() const { return options_.max_frame_bytes; }

  asio::io_context io_;

 private:
  void wait_for(const std::shared_ptr<Session>& session, std::vector<std::string> keys, bool is_get,
                uint64_t timeout_ms);
  Bytes ok_reply(const Waiter& w) const;
  // Re-examines the waiters parked on `key`, which may just have appeared.
  void notify(const std::string& key);
  // Registers `w` under its first missing key; false if none is missing.
  bool watch(const std::shared_ptr<Waiter>& w);
  void unwatch(const std::shared_ptr<Waiter>& w);

  const TCPStoreOptions options_;
  tcp::acceptor acceptor_{io_};
  std::optional<auth::Gatekeeper> door_;  // admits the clients that prove the job key
  std::thread thread_;
  uint16_t port_ = 0;
  KeyMap map_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> watchers_;
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
};

namespace {

uint32_t le32(const std::array<uint8_t, 4>& b) {
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

// One client connection: read a frame, execute it, write the reply, repeat.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // `stream` passed the handshakes, which set TCP_NODELAY.
  Session(Stream stream, TCPStoreServer::Impl& server)
      : socket_(std::move(stream)), server_(server) {}

  void read_header() {
    asio::async_read(
        socket_, asio::buffer(header_), [self = shared_from_this()](std::error_code ec, size_t) {
          uint32_t n = le32(self->header_);
          // A bad length is a broken or hostile client: drop it, serve the rest.
          if (ec || self->closed_ || n == 0 || n > self->server_.max_frame_bytes()) {
            if (!ec && !self->closed_)
              log_error("[TCPStore] closing a client's connection: its request of ", n,
                        " bytes exceeds max_frame_bytes ", self->server_.max_frame_bytes());
            return self->close();
          }
          self->read_body(n);
        });
  }

  void reply(Bytes body) {
    if (closed_) return;
    reply_body_ = std::move(body);
    auto n = static_cast<uint32_t>(reply_body_.size());
    for (int i = 0; i < 4; ++i) reply_header_[i] = static_cast<uint8_t>(n >> (8 * i));
    std::array buffers{asio::buffer(reply_header_), asio::buffer(reply_body_)};
    asio::async_write(socket_, buffers, [self = shared_from_this()](std::error_code ec, size_t) {
      if (ec) return self->close();
      self->read_header();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    std::error_code ignored;
    socket_.close(ignored);
    server_.forget(this);
  }

 private:
  void read_body(uint32_t n) {
    body_.resize(n);
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       // closed_: the read completed just before stop() closed the session, so
                       // its request must not arm a wait that would keep the server running.
                       if (ec || self->closed_) return self->close();
                       try {
                         self->server_.handle(self, std::move(self->body_));
                       } catch (const std::exception&) {
                         self->close();
                       }
                     });
  }

  Stream socket_;
  TCPStoreServer::Impl& server_;
  std::array<uint8_t, 4> header_{};
  Bytes body_;
  std::array<uint8_t, 4> reply_header_{};
  Bytes reply_body_;
  bool closed_ = false;
};

}  // namespace

TCPStoreServer::Impl::Impl(const std::string& address, const TCPStoreOptions& options,
                           const JobKey& key, const TlsContext& tls)
    : options_(options) {
  GW_CHECK(options.max_frame_bytes > 0 && options.max_frame_bytes <= kMaxFrameBytes,
           InvalidArgumentError, "[TCPStore] max_frame_bytes ", options.max_frame_bytes,
           " is outside [1, ", kMaxFrameBytes, "]");
  std::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  GW_CHECK(!ec, InvalidArgumentError, "[TCPStore] bind address '", address,
           "' is not an IP address");
  ec = auth::listen(acceptor_, ip, options.port);
  GW_CHECK(!ec, IoError, "[TCPStore] cannot listen on port ", options.port, " of ", address, ": ",
           ec.message(),
           ec == std::errc::address_not_available
               ? " (not an address of this host: set GW_STORE_BIND_ADDRESS or "
                 "TCPStoreOptions::bind_address to one)"
               : "");
  port_ = acceptor_.local_endpoint().port();
  door_.emplace(acceptor_,
                auth::Gatekeeper::Options{key,
                                          auth::Purpose::kStore,
                                          {"store", -1},
                                          options.handshake_timeout,
                                          options.max_unauthenticated_connections,
                                          "TCPStore",
                                          tls},
                [this](std::shared_ptr<Stream> s, const auth::Identity&, const std::string&) {
                  auto session = std::make_shared<Session>(std::move(*s), *this);
                  sessions_.emplace(session.get(), session);
                  session->read_header();
                });
  door_->start();
}

void TCPStoreServer::Impl::stop() {
  // Close everything on the server thread; run() returns once the aborted handlers drain.
  asio::post(io_, [this] {
    door_->stop();
    for (auto& [key, list] : watchers_)
      for (auto& w : list) w->timer.cancel();
    watchers_.clear();
    auto sessions = std::move(sessions_);
    sessions_.clear();
    for (auto& [ptr, session] : sessions) session->close();
  });
  thread_.join();
}

void TCPStoreServer::Impl::handle(const std::shared_ptr<Session>& session, Bytes body) {
  ByteReader in(std::move(body), kWhat);
  auto cmd = static_cast<Command>(in.u8());
  ByteWriter out(kWhat);
  std::optional<std::string> changed;  // a key that may have appeared, for parked waiters
  switch (cmd) {
    case Command::kSet: {
      std::string key = in.str();
      Bytes value = in.bytes();
      in.expect_done();
      map_[key] = std::move(value);
      out.u8(static_cast<uint8_t>(Status::kOk));
      changed = std::move(key);
      break;
    }
    case Command::kGet:
    case Command::kWait: {
      std::vector<std::string> keys;
      if (cmd == Command::kGet)
        keys.push_back(in.str());
      else
        keys = in.strings();
      uint64_t timeout_ms = in.u64();
      in.expect_done();
      return wait_for(session, std::move(keys), cmd == Command::kGet, timeout_ms);
    }
    case Command::kAdd: {
      std::string key = in.str();
      auto delta = static_cast<int64_t>(in.u64());
      in.expect_done();
      try {
        int64_t value = add_to_map("TCPStore::add", map_, key, delta);
        out.u8(static_cast<uint8_t>(Status::kOk));
        out.u64(static_cast<uint64_t>(value));
        changed = std::move(key);
      } catch (const InvalidArgumentError& e) {  // not a counter: the client rethrows it
        out.u8(static_cast<uint8_t>(Status::kInvalidArgument));
        out.str(e.what());
      }
      break;
    }
    case Command::kCompareSet: {
      std::string key = in.str();
      Bytes expected = in.bytes();
      Bytes desired = in.bytes();
      in.expect_done();
      CompareSetResult result = compare_set_in_map(map_, key, expected, desired);
      out.u8(static_cast<uint8_t>(Status::kOk));
      out.bytes(result.value);
      if (result.swapped) changed = std::move(key);
      break;
    }
    case Command::kCheck: {
      std::vector<std::string> keys = in.strings();
      in.expect_done();
      out.u8(static_cast<uint8_t>(Status::kOk));
      out.u8(map_has_all(map_, keys) ? 1 : 0);
      break;
    }
    case Command::kDeleteKey: {
      std::string key = in.str();
      in.expect_done();
      out.u8(static_cast<uint8_t>(Status::kOk));
      out.u8(map_.erase(key) > 0 ? 1 : 0);
      break;
    }
    case Command::kNumKeys:
      in.expect_done();
      out.u8(static_cast<uint8_t>(Status::kOk));
      out.u64(static_cast<uint64_t>(map_.size()));
      break;
    default:
      throw IoError(gw::detail::str("[", kWhat, "] unknown command ", static_cast<int>(cmd)));
  }
  session->reply(out.take());
  if (changed) notify(*changed);
}

Bytes TCPStoreServer::Impl::ok_reply(const Waiter& w) const {
  ByteWriter out(kWhat);
  out.u8(static_cast<uint8_t>(Status::kOk));
  if (w.is_get) out.bytes(map_.at(w.keys[0]));
  return out.take();
}

void TCPStoreServer::Impl::wait_for(const std::shared_ptr<Session>& session,
                                    std::vector<std::string> keys, bool is_get,
                                    uint64_t timeout_ms) {
  auto w = std::make_shared<Waiter>(io_, session, std::move(keys), is_get);
  if (!watch(w)) return session->reply(ok_reply(*w));
  w->timer.expires_after(std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs)));
  w->timer.async_wait([this, w](std::error_code ec) {
    if (ec || w->done) return;
    w->done = true;
    unwatch(w);
    std::vector<std::string> missing;
    for (const auto& k : w->keys)
      if (!map_.contains(k)) missing.push_back(k);
    ByteWriter out(kWhat);
    out.u8(static_cast<uint8_t>(Status::kTimeout));
    out.strings(missing);
    w->session->reply(out.take());
  });
}

bool TCPStoreServer::Impl::watch(const std::shared_ptr<Waiter>& w) {
  for (const auto& k : w->keys) {
    if (map_.contains(k)) continue;
    w->watching = k;
    watchers_[k].push_back(w);
    return true;
  }
  return false;
}

void TCPStoreServer::Impl::unwatch(const std::shared_ptr<Waiter>& w) {
  auto it = watchers_.find(w->watching);
  if (it == watchers_.end()) return;
  std::erase(it->second, w);
  if (it->second.empty()) watchers_.erase(it);
}

void TCPStoreServer::Impl::notify(const std::string& key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  auto parked = std::move(it->second);
  watchers_.erase(it);
  for (auto& w : parked) {
    if (w->done || watch(w)) continue;  // still missing another key: parked again under it
    w->done = true;
    w->timer.cancel();
    w->session->reply(ok_reply(*w));
  }
}

TCPStoreServer::TCPStoreServer(const std::string& address, const TCPStoreOptions& options,
                               const JobKey& key, const TlsContext& tls)
    : impl_(std::make_unique<Impl>(address, options, key, tls)) {
  impl_->start();
}

TCPStoreServer::~TCPStoreServer() { impl_->stop(); }

uint16_t TCPStoreServer::port() const { return impl_->port(); }

}  // namespace gw::store::detail
