// The agent's connections: accepting, connecting within a call's timeout, losing them; and
// the device maps that connections' handshakes carry.
#include <cerrno>
#include <climits>

#include <poll.h>
#include <sys/socket.h>

#include "rpc/agent_impl.h"
#include "rpc/autograd_hook.h"
#include "rpc/log.h"

namespace gw::rpc {

namespace {
// Connects `s` to `ep`, giving up after `timeout` (0: the kernel's own limit), which sets
// `gave_up`. A plain blocking connect to a host that drops packets would hold the caller, and
// every other caller of that peer, for the kernel's SYN retries (minutes), whatever the call's
// timeout. asio's connect always blocks, so the socket is connected non-blocking here and
// polled on this thread: the network thread may be the caller (a callback sending a call), so
// it cannot do the waiting.
std::error_code connect_within(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep,
                               Milliseconds timeout, bool& gave_up) {
  gave_up = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::error_code ec;
  s.open(ep.protocol(), ec);
  if (ec) return ec;
  const int fd = s.native_handle();
  s.native_non_blocking(true, ec);
  if (ec) return ec;
  if (::connect(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
    if (errno != EINPROGRESS) return {errno, std::system_category()};
    pollfd pending{.fd = fd, .events = POLLOUT, .revents = 0};
    while (true) {
      int wait_ms = -1;
      if (timeout.count() > 0) {
        const auto left =
            std::chrono::duration_cast<Milliseconds>(deadline - std::chrono::steady_clock::now())
                .count();
        if (left <= 0) {
          gave_up = true;
          return std::make_error_code(std::errc::timed_out);
        }
        wait_ms = static_cast<int>(std::min<int64_t>(left, INT_MAX));
      }
      const int ready = ::poll(&pending, 1, wait_ms);
      if (ready > 0) break;
      if (ready < 0 && errno != EINTR) return {errno, std::system_category()};
      // The wait ran out (the deadline check above decides) or a signal cut it short.
    }
    int error = 0;
    socklen_t len = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0)
      return {errno, std::system_category()};
    if (error != 0) return {error, std::system_category()};
  }
  s.native_non_blocking(false, ec);
  return ec;
}
}  // namespace

void check_device_map(const std::string& to, const std::map<int, int>& map) {
  std::map<int, int> source_of;  // by target
  for (const auto& [from, dst] : map) {
    GW_CHECK(from >= 0 && dst >= 0 && from < kMaxDevices && dst < kMaxDevices, InvalidArgumentError,
             "[set_device_map] devices are CUDA indices in [0, ", kMaxDevices, "); got ", from,
             " -> ", dst, " toward '", to, "'");
    auto [it, fresh] = source_of.emplace(dst, from);
    GW_CHECK(fresh, InvalidArgumentError, "[set_device_map] the map toward '", to,
             "' would put cuda:", it->second, " and cuda:", from, " both on cuda:", dst,
             ": it must be invertible");
  }
}

void RpcBackendOptions::set_device_map(const std::string& to, const std::map<int, int>& map) {
  auto known = device_maps.find(to);
  std::map<int, int> merged = known == device_maps.end() ? std::map<int, int>{} : known->second;
  for (const auto& [from, dst] : map) merged[from] = dst;
  check_device_map(to, merged);
  device_maps[to] = std::move(merged);
}

DeviceMap Agent::device_map_to(int peer, bool reply) {
  if (peer < 0) return {};
  if (!reply && !impl_->maps_to[static_cast<size_t>(peer)].empty())
    return impl_->maps_to[static_cast<size_t>(peer)];
  std::lock_guard lock(impl_->maps_mu);
  return impl_->maps_back[static_cast<size_t>(peer)];
}

std::shared_ptr<Connection> Agent::Impl::make_connection(asio::ip::tcp::socket socket) {
  return std::make_shared<Connection>(std::move(socket), max_frame_bytes, on_message, on_close);
}

void Agent::accept_next() {
  impl_->acceptor.async_accept([this](const std::error_code& ec, asio::ip::tcp::socket s) {
    if (ec) return;  // the acceptor was closed
    try {
      auto c = impl_->make_connection(std::move(s));
      {
        std::lock_guard lock(impl_->conn_mu);
        impl_->inbound.insert(c);
      }
      c->start();
    } catch (const std::exception& e) {
      log_error(self_.name, ": could not set up an accepted connection: ", e.what());
    }
    accept_next();
  });
}

std::shared_ptr<Connection> Agent::connection_to(int id, Milliseconds timeout) {
  const auto& ep = impl_->endpoints[id];
  auto failure = [&](const std::string& what) {
    return gw::detail::str("[rpc] connecting to worker '", workers_[id].name, "' at ",
                           ep.address().to_string(), ":", ep.port(), " ", what);
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  {
    // Another caller's connect to this peer may be under way: wait for it, within our timeout.
    std::unique_lock lock(impl_->conn_mu);
    auto idle = [&] { return !impl_->connecting[id]; };
    if (timeout.count() == 0)
      impl_->connect_done.wait(lock, idle);
    else if (!impl_->connect_done.wait_until(lock, deadline, idle))
      throw TimeoutError(failure(gw::detail::str("timed out after ", timeout.count(),
                                                 " ms, waiting for another call's connect")));
    if (auto& c = impl_->outbound[id]; c && !c->closed()) return c;
    impl_->connecting[id] = true;
  }
  struct Done {  // whatever happens next, the next caller may try
    Impl& impl;
    int id;
    ~Done() {
      {
        std::lock_guard lock(impl.conn_mu);
        impl.connecting[id] = false;
      }
      impl.connect_done.notify_all();
    }
  } done{*impl_, id};
  asio::ip::tcp::socket s(impl_->io);
  Milliseconds left{0};
  if (timeout.count() > 0)
    left = std::max(Milliseconds(1), std::chrono::duration_cast<Milliseconds>(
                                         deadline - std::chrono::steady_clock::now()));
  bool gave_up = false;
  if (std::error_code ec = connect_within(s, ep, left, gave_up)) {
    if (gave_up)
      throw TimeoutError(failure(gw::detail::str("timed out after ", timeout.count(), " ms")));
    throw IoError(failure("failed: " + ec.message()));
  }
  auto c = impl_->make_connection(std::move(s));
  c->set_peer_id(id);
  // The handshake goes first, before other threads can find the connection and send on it.
  Message hello;
  hello.body = Handshake{kProtocolVersion, self_.name, self_.id};
  hello.device_map = impl_->maps_to[id];
  c->send(hello);
  {
    // Registered before it starts reading, and only while running: stop() closes what is
    // registered, and one opened behind its back would keep the network thread alive.
    std::lock_guard lock(impl_->conn_mu);
    GW_CHECK(running_, StateError, "[rpc] the RPC agent '", self_.name, "' is shut down");
    impl_->outbound[id] = c;
  }
  c->start();
  return c;
}

void Agent::on_close(const std::shared_ptr<Connection>& c, const std::string& why) {
  {
    std::lock_guard lock(impl_->conn_mu);
    impl_->inbound.erase(c);
    int peer = c->peer_id();
    if (peer >= 0 && impl_->outbound[peer] == c) impl_->outbound[peer].reset();
  }
  fail_pending_on(c.get(), why);
  if (autograd_ && c->peer_id() >= 0) autograd_->on_connection_lost(c->peer_id(), why);
}

void Agent::fail_pending_on(const Connection* conn, const std::string& why) {
  std::vector<PendingCall> failed;
  {
    std::lock_guard lock(impl_->pending_mu);
    for (auto it = impl_->pending.begin(); it != impl_->pending.end();) {
      auto next = std::next(it);
      if (it->second.conn == conn) failed.push_back(impl_->take_pending_locked(it));
      it = next;
    }
  }
  for (auto& p : failed)
    Impl::fail<IoError>(p, workers_[p.peer].name, "failed: connection lost (" + why + ")");
  impl_->idle.notify_all();
}

}  // namespace gw::rpc
