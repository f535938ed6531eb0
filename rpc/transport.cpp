#include "rpc/transport.h"

#include <algorithm>

#include "core/log.h"
#include "store/liveness.h"

namespace gw::rpc {

namespace {
constexpr auto kPollAfterWork = std::chrono::microseconds(50);
}  // namespace

Transport::Transport(Options options, Handlers handlers)
    : options_(std::move(options)), handlers_(std::move(handlers)) {
  const std::string& address = options_.address;
  std::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  GW_CHECK(!ec, InvalidArgumentError, "[init_rpc] address '", address,
           "' is not an IP address: ", ec.message());
  ec = store::auth::listen(acceptor_, ip, 0);
  GW_CHECK(!ec, IoError, "[init_rpc] cannot listen on ", address, ": ", ec.message());
  door_.emplace(acceptor_,
                store::auth::Gatekeeper::Options{options_.key,
                                                 store::auth::Purpose::kRpc,
                                                 {options_.self_name, options_.self_id},
                                                 options_.handshake_timeout,
                                                 options_.max_unauthenticated,
                                                 "rpc " + self_name_,
                                                 options_.tls},
                [this](std::shared_ptr<store::Stream> s, const store::auth::Identity& peer,
                       const std::string& from) { admit(s, peer, from); });
}

Transport::~Transport() { stop("the RPC agent was destroyed"); }

uint16_t Transport::port() const { return acceptor_.local_endpoint().port(); }

void Transport::start(const std::vector<PeerAddress>& peers, CallTable& calls,
                      const std::function<void()>& on_thread_start) {
  calls_ = &calls;
  {
    std::lock_guard lock(mu_);
    peers_.resize(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) {
      std::error_code ec;
      const auto ip = asio::ip::make_address(peers[i].host, ec);
      GW_CHECK(!ec, IoError, "[init_rpc] worker '", peers[i].name, "' published address '",
               peers[i].host, "', which is not an IP address");
      peers_[i].endpoint = Endpoint(ip, peers[i].port);
      peers_[i].name = peers[i].name;
    }
  }
  on_thread_start_ = on_thread_start;
  asio::post(io_, [this] {
    door_->start();
    if (options_.failure_timeout.count() > 0) {
      last_check_ = Clock::now();
      check_liveness();
    }
  });
  thread_ = std::thread([this, on_thread_start] {
    if (on_thread_start) on_thread_start();
    // After its last work the thread looks for more, yielding, for kPollAfterWork before it
    // sleeps in epoll: in a conversation the next frame (the answer to a call just sent, the
    // next call of a caller just answered) usually comes sooner, and finding it costs less
    // than the wake-up from epoll (10-15 us on a VM). At most 50 us of a core per burst.
    auto last_work = Clock::now();
    while (!io_.stopped()) {
      if (io_.poll() > 0) {
        last_work = Clock::now();
      } else if (Clock::now() - last_work < kPollAfterWork) {
        std::this_thread::yield();
      } else {
        io_.run_one();
        last_work = Clock::now();
      }
    }
  });
}

std::string Transport::describe(int peer) const {
  const Peer& p = peers_[static_cast<size_t>(peer)];
  return gw::detail::str("worker '", p.name, "' at ", p.endpoint.address().to_string(), ":",
                         p.endpoint.port());
}

std::shared_ptr<Connection> Transport::make_connection(store::Stream s) {
  return std::make_shared<Connection>(
      std::move(s), options_.max_frame_bytes,
      [this](const std::shared_ptr<Connection>& c, Message m) {
        std::lock_guard lock(handling_mu_);
        // A frame its ring thread took before the connection closed (at the drain limit, while
        // it waited here) is dropped: the peer's next connection may be in by now, and its
        // frames must not be overtaken by older ones (rpc/rref_context.h counts on that order).
        // Its call, or its caller's, failed with the connection.
        if (c->closed()) return;
        handlers_.on_message(c, std::move(m));
      },
      [this](const std::shared_ptr<Connection>& c, const std::string& why) {
        {
          std::lock_guard lock(mu_);
          inbound_.erase(c);
          const int peer = c->peer_id();
          if (peer >= 0 && !stopping_) {
            Peer& p = peers_[static_cast<size_t>(peer)];
            if (p.conn == c) p.conn.reset();
            p.lost =
                gw::detail::str("the connection with ", describe(peer), " was lost (", why, ")");
          }
        }
        handlers_.on_close(c, why);
      },
      ShmOptions{options_.shm_ring_bytes, on_thread_start_, ring_threads_});
}

// --- liveness --------------------------------------------------------------------------------

void Transport::check_liveness() {
  const auto now = Clock::now();
  // What peers sent while this process did not run is read before the next check.
  const bool late = store::check_ran_late(now - last_check_, options_.failure_timeout);
  last_check_ = now;
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    all.assign(inbound_.begin(), inbound_.end());
    for (const auto& p : peers_)
      if (p.conn) all.push_back(p.conn);
  }
  const auto beat = store::heartbeat_period(options_.failure_timeout);
  for (const auto& c : all) {
    if (c->closed()) continue;
    if (!late && now - c->last_heard() > options_.failure_timeout && c->peer_id() >= 0)
      declare_dead(c->peer_id());
    else if (now - c->last_sent() >= beat)
      c->send_heartbeat();
  }
  liveness_.expires_after(store::liveness_check_period(options_.failure_timeout));
  liveness_.async_wait([this](const std::error_code& ec) {
    if (!ec) check_liveness();
  });
}

void Transport::declare_dead(int peer) {
  std::vector<std::shared_ptr<Connection>> lost;
  std::string why;
  {
    std::lock_guard lock(mu_);
    Peer& p = peers_[static_cast<size_t>(peer)];
    if (!p.dead.empty()) return;
    p.dead =
        describe(peer) + " declared dead: " + store::no_heartbeat_for(options_.failure_timeout);
    why = p.dead;
    if (p.conn) lost.push_back(p.conn);
    for (const auto& c : inbound_)
      if (c->peer_id() == peer) lost.push_back(c);
  }
  log_error(self_name_, ": ", why);
  for (const auto& c : lost) c->close(why);
  fail_queue(peer, std::make_exception_ptr(IoError("[rpc] " + why)));
}

std::string Transport::gone(int peer) const {
  std::lock_guard lock(mu_);
  const Peer& p = peers_[static_cast<size_t>(peer)];
  return !p.dead.empty() ? p.dead : p.lost;
}

// Network thread: `peer` proved the key on `s`; it becomes a connection if it is one of the
// job's workers without another live connection to us.
void Transport::admit(const std::shared_ptr<store::Stream>& s, const store::auth::Identity& peer,
                      const std::string& from) {
  std::shared_ptr<Connection> c;
  std::string refused;
  {
    std::lock_guard lock(mu_);
    if (peer.id < 0 || peer.id >= static_cast<int>(peers_.size()) ||
        peers_[static_cast<size_t>(peer.id)].name != peer.name) {
      refused =
          gw::detail::str("'", peer.name, "' (id ", peer.id, ") is not a worker of this group");
    } else if (const std::string& dead = peers_[static_cast<size_t>(peer.id)].dead; !dead.empty()) {
      refused = dead;
    } else if (std::any_of(inbound_.begin(), inbound_.end(), [&](const auto& other) {
                 return other->peer_id() == peer.id && !other->closed();
               })) {
      refused = gw::detail::str("worker '", peer.name, "' already has a live connection here");
    } else {
      try {
        c = make_connection(std::move(*s));
        c->set_peer_id(peer.id);
        inbound_.insert(c);
        peers_[static_cast<size_t>(peer.id)].lost.clear();
      } catch (const std::exception& e) {
        refused = gw::detail::str("could not set up the connection: ", e.what());
      }
    }
  }
  if (c) return c->start();
  door_->refused(from, refused);
  std::error_code ignored;
  s->close(ignored);
}

// --- sending ---------------------------------------------------------------------------------

void Transport::send(int peer, Message m, Clock::time_point deadline) {
  std::shared_ptr<Connection> open;
  std::string dead;
  {
    std::lock_guard lock(mu_);
    Peer& p = peers_[static_cast<size_t>(peer)];
    if (stopping_) {
      // Below, outside the lock.
    } else if (!p.dead.empty()) {
      dead = p.dead;
    } else if (p.conn && !p.connecting && !p.conn->closed()) {
      open = p.conn;
    } else {
      // Queued behind the connect (or the flush of its queue) so that order is kept.
      p.queue.push_back({std::move(m), deadline});
      if (!p.connecting) {
        p.connecting = true;
        asio::post(io_, [this, peer] { connect(peer); });
      }
      return;
    }
  }
  if (!dead.empty()) {
    unsent(m, std::make_exception_ptr(IoError("[rpc] " + dead)));
    return;
  }
  if (!open) {
    unsent(m, std::make_exception_ptr(StateError(
                  gw::detail::str("[rpc] the RPC agent '", self_name_, "' is shut down"))));
    return;
  }
  write(open, m);
}

void Transport::write(const std::shared_ptr<Connection>& c, Message& m) {
  calls_->bind(m.id, c.get());
  std::exception_ptr error;
  try {
    c->send(m);
  } catch (...) {
    error = std::current_exception();
  }
  // Outside the catch: the caller's thread may get (and drop) the error first.
  if (error) unsent(m, std::move(error));
}

void Transport::unsent(Message& m, std::exception_ptr why) {
  handlers_.unsent(m);
  calls_->fail(m.id, std::move(why));
}

// Network thread: opens the connection to `peer` without waiting for it.
void Transport::connect(int peer) {
  auto s = std::make_shared<store::Stream>(asio::ip::tcp::socket(io_), options_.tls);
  std::shared_ptr<asio::steady_timer> timer;
  Endpoint ep;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;  // stop() fails the queue
    Peer& p = peers_[static_cast<size_t>(peer)];
    p.socket = s;
    ep = p.endpoint;
    auto first = earliest_deadline_locked(p);
    if (p.queue.empty() && options_.failure_timeout.count() > 0)
      first = Clock::now() + options_.failure_timeout;  // a probe: a live worker answers by then
    if (first != Clock::time_point::max()) {
      timer = std::make_shared<asio::steady_timer>(io_, first);
      p.timer = timer;
      watch_connect(peer, s, timer);
    }
  }
  s->socket().async_connect(ep, [this, peer, s, timer](const std::error_code& ec) {
    auto done = [this, peer, s, timer](std::exception_ptr failed, const store::auth::Identity&) {
      if (timer) timer->cancel();
      connected(peer, s, failed);
    };
    if (ec) return done(std::make_exception_ptr(IoError(ec.message())), {});
    store::auth::async_connect(
        s, options_.key, store::auth::Purpose::kRpc, {options_.self_name, options_.self_id},
        {peers_[static_cast<size_t>(peer)].name, peer}, options_.handshake_timeout, done);
  });
}

// At each queued request's deadline, the requests out of time leave the queue (unsent); the
// connect gives up (closing the socket aborts it) once nothing is left to wait for it. Caller
// holds mu_.
void Transport::watch_connect(int peer, std::shared_ptr<store::Stream> s,
                              std::shared_ptr<asio::steady_timer> timer) {
  timer->async_wait([this, peer, s, timer](const std::error_code& ec) {
    if (ec) return;  // cancelled: the connect completed
    std::deque<Queued> expired;
    {
      std::lock_guard lock(mu_);
      Peer& p = peers_[static_cast<size_t>(peer)];
      if (p.socket != s) return;
      expired = take_expired_locked(p);
      if (p.queue.empty()) {
        p.timed_out = true;
        std::error_code ignored;
        s->close(ignored);
      } else if (const auto next = earliest_deadline_locked(p); next != Clock::time_point::max()) {
        timer->expires_at(next);
        watch_connect(peer, s, timer);
      }
    }
    expire(peer, expired);
  });
}

std::deque<Transport::Queued> Transport::take_expired_locked(Peer& p) {
  std::deque<Queued> expired, left;
  const auto now = Clock::now();
  for (auto& q : p.queue) (q.deadline <= now ? expired : left).push_back(std::move(q));
  p.queue.swap(left);
  return expired;
}

Transport::Clock::time_point Transport::earliest_deadline_locked(const Peer& p) {
  auto first = Clock::time_point::max();
  for (const auto& q : p.queue) first = std::min(first, q.deadline);
  return first;
}

void Transport::expire(int peer, std::deque<Queued>& expired) {
  for (auto& q : expired)
    unsent(q.message,
           std::make_exception_ptr(TimeoutError("[rpc] connecting to " + describe(peer) +
                                                " took longer than the call's timeout")));
}

// Network thread: the connect to `peer` finished; on success, writes the Handshake and then the
// queue, in order.
void Transport::connected(int peer, std::shared_ptr<store::Stream> s, std::exception_ptr failed) {
  bool timed_out = false, again = false;
  std::deque<Queued> expired;
  {
    std::lock_guard lock(mu_);
    Peer& p = peers_[static_cast<size_t>(peer)];
    timed_out = p.timed_out;
    p.timed_out = false;
    p.socket.reset();
    p.timer.reset();
    if (stopping_) return;  // stop() fails the queue
    if (timed_out) {
      // Requests that joined after the connect gave up still have time: try again for them.
      expired = take_expired_locked(p);
      again = !p.queue.empty();
      p.connecting = again;
      if (expired.empty() && !again)  // a probe that got no answer
        p.lost = describe(peer) + " did not answer a connection within " +
                 store::failure_window(options_.failure_timeout);
    }
  }
  if (timed_out) {
    expire(peer, expired);
    if (again) connect(peer);
    return;
  }
  std::shared_ptr<Connection> c;
  std::exception_ptr error;
  try {
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const TimeoutError& e) {
        throw TimeoutError("[rpc] connecting to " + describe(peer) + ": " + e.what());
      } catch (const std::exception& e) {
        throw IoError("[rpc] connecting to " + describe(peer) + " failed: " + e.what());
      }
    }
    c = make_connection(std::move(*s));
    c->set_peer_id(peer);
    // The handshake goes first, before any request.
    Message hello = handlers_.hello(peer);
    c->offer_shm(hello);
    c->send(hello);
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {  // outside the catch: the callers' threads may drop it first
    {
      std::lock_guard lock(mu_);
      peers_[static_cast<size_t>(peer)].lost = what_of(error);
    }
    fail_queue(peer, std::move(error));
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      c->close("the RPC agent is shutting down");
      return;
    }
    if (const std::string& dead = peers_[static_cast<size_t>(peer)].dead; !dead.empty()) {
      c->close(dead);  // declared dead while connecting: its queue has been failed
      return;
    }
    // Known as the peer's connection from now (late answers on it are ours), but used by
    // other senders only once the queue is written.
    peers_[static_cast<size_t>(peer)].conn = c;
    peers_[static_cast<size_t>(peer)].lost.clear();
  }
  c->start();
  for (;;) {  // bounded: each round takes what was queued while the previous one was written
    std::deque<Queued> batch;
    {
      std::lock_guard lock(mu_);
      Peer& p = peers_[static_cast<size_t>(peer)];
      if (p.queue.empty() || stopping_) {
        p.connecting = false;
        break;
      }
      batch.swap(p.queue);
    }
    for (auto& q : batch) {
      if (Clock::now() >= q.deadline)
        expired.push_back(std::move(q));
      else
        write(c, q.message);
    }
    expire(peer, expired);
    expired.clear();
  }
}

void Transport::fail_queue(int peer, std::exception_ptr why) {
  std::deque<Queued> failed;
  {
    std::lock_guard lock(mu_);
    Peer& p = peers_[static_cast<size_t>(peer)];
    failed.swap(p.queue);
    p.connecting = false;
  }
  for (auto& q : failed) unsent(q.message, why);
}

void Transport::probe(int peer) {
  {
    std::lock_guard lock(mu_);
    Peer& p = peers_[static_cast<size_t>(peer)];
    if (stopping_ || !p.dead.empty() || p.connecting || (p.conn && !p.conn->closed())) return;
    p.connecting = true;
  }
  asio::post(io_, [this, peer] { connect(peer); });
}

std::string Transport::link(int peer) const {
  std::lock_guard lock(mu_);
  const auto& c = peers_[static_cast<size_t>(peer)].conn;
  return c && !c->closed() ? c->link() : "none";
}

bool Transport::is_outbound(const std::shared_ptr<Connection>& c) const {
  std::lock_guard lock(mu_);
  const int peer = c->peer_id();
  return peer >= 0 && peers_[static_cast<size_t>(peer)].conn == c;
}

// --- stopping --------------------------------------------------------------------------------

void Transport::stop(const std::string& why) {
  GW_CHECK(!ring_threads_->counts_this_thread(), StateError,
           "[rpc] an RPC agent is stopped from its own connection's thread (a future callback)");
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (!thread_.joinable()) {  // never started
    std::error_code ignored;
    acceptor_.close(ignored);
    return;
  }
  asio::post(io_, [this, why] {
    std::error_code ignored;
    door_->stop();
    liveness_.cancel();
    std::vector<std::shared_ptr<Connection>> all;
    {
      std::lock_guard lock(mu_);
      all.assign(inbound_.begin(), inbound_.end());
      for (auto& p : peers_) {
        if (p.conn) all.push_back(p.conn);
        if (p.socket) p.socket->close(ignored);  // its connect completes, aborted
        if (p.timer) p.timer->cancel();
      }
    }
    for (auto& c : all) c->close(why);
    const auto shut = std::make_exception_ptr(
        StateError(gw::detail::str("[rpc] the RPC agent '", self_name_, "' stopped: ", why)));
    for (size_t i = 0; i < peers_.size(); ++i) fail_queue(static_cast<int>(i), shut);
    work_.reset();
  });
  thread_.join();
  ring_threads_->wait_none();  // every connection is closed: their ring threads end
  std::lock_guard lock(mu_);
  inbound_.clear();
  for (auto& p : peers_) p.conn.reset();
}

}  // namespace gw::rpc
