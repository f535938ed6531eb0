#include "store/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "store/liveness.h"

namespace gw::store::detail {
namespace {

// Under TLS, messages up to this size are joined into one record.
constexpr size_t kJoinBytes = 16 * 1024;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// One non-blocking connect attempt to one address; returns the fd or -1 with errno set.
// `window`: failure_timeout, for the keepalive below (0: none).
int try_connect(const addrinfo* ai, Clock::time_point deadline, Milliseconds window) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return -1;
  int err = 0;
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int rc = ::poll(&p, 1, remaining_ms(deadline));
      socklen_t len = sizeof(err);
      if (rc <= 0)
        err = rc == 0 ? ETIMEDOUT : errno;
      else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    }
  }
  if (err != 0) {
    ::close(fd);
    errno = err;
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // requests are small
  // A store host that vanished (power, a cut link) must not hold a parked wait for the store's
  // whole timeout: keepalive probes a quiet connection every fifth of failure_timeout, and
  // TCP_USER_TIMEOUT drops it once probes or data go unanswered for failure_timeout. (A stopped
  // store process still answers probes; its rank's own heartbeats catch that.)
  if (window.count() > 0) {
    const int probe_s = std::max<int>(1, static_cast<int>(window.count() / 5000));
    const auto user_timeout_ms = static_cast<unsigned>(window.count());
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s);
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
  }
  return fd;
}

}  // namespace

TcpSocket TcpSocket::connect(const std::string& host, uint16_t port, Clock::time_point deadline,
                             const char* op, bool server_was_up) {
  const auto start = Clock::now();
  const std::string peer = host + ":" + std::to_string(port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  constexpr auto kTellAfter = std::chrono::seconds(10);
  bool told = false;
  const Milliseconds window = failure_timeout(kFailureTimeoutFromEnv, op);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      bool all_refused = list != nullptr;
      for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
        int fd = try_connect(ai, deadline, window);
        if (fd >= 0) {
          ::freeaddrinfo(list);
          return TcpSocket(fd, peer);
        }
        last_error = std::strerror(errno);
        all_refused = all_refused && errno == ECONNREFUSED;
      }
      ::freeaddrinfo(list);
      // Every address of a server that was up refused: it is gone, not late.
      GW_CHECK(!(server_was_up && all_refused), IoError, "[", op, "] the store at ", peer,
               " refused the connection: it is gone (its process exited?); it was up before");
    }
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(gw::detail::str(
          "[", op, "] could not connect to ", peer, " within ",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(),
          " ms (last error: ", last_error, ")"));
    // A master that failed before its store came up cannot say so: whoever waits for it says
    // what it waits for, once, instead of waiting in silence.
    if (!told && now - start >= kTellAfter) {
      told = true;
      log_error("[", op, "] still trying to reach ", peer, " (the master's store) after ",
                std::chrono::duration_cast<std::chrono::seconds>(now - start).count(),
                " s; giving up in ",
                std::chrono::duration_cast<std::chrono::seconds>(deadline - now).count(),
                " s (last error: ", last_error, ")");
    }
    // The server may not be up yet: retry, backing off so many waiting clients stay cheap.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

TcpSocket::TcpSocket(TcpSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      peer_(std::move(other.peer_)),
      tls_(std::move(other.tls_)) {}

TcpSocket& TcpSocket::operator=(TcpSocket&& other) noexcept {
  if (this != &other) {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
    tls_ = std::move(other.tls_);
  }
  return *this;
}

TcpSocket::~TcpSocket() {
  tls_.reset();
  if (fd_ >= 0) ::close(fd_);
}

TlsSession::Wait TcpSocket::tls_wait(Clock::time_point deadline, const char* op) {
  return [this, deadline, op](bool write) { wait_ready(write ? POLLOUT : POLLIN, deadline, op); };
}

void TcpSocket::start_tls(const TlsContext& tls, Clock::time_point deadline, const char* op) {
  tls_ = std::make_unique<TlsSession>(tls, fd_, tls_wait(deadline, op), peer_, op);
}

auth::ChannelBinding TcpSocket::channel_binding() const {
  return tls_ ? tls_->channel_binding() : auth::ChannelBinding{};
}

void TcpSocket::throw_lost(const char* op, int err) const {
  throw IoError(
      gw::detail::str("[", op, "] connection to ", peer_, " lost",
                      err != 0 ? gw::detail::str(": ", std::strerror(err)) : std::string()));
}

void TcpSocket::wait_ready(short events, Clock::time_point deadline, const char* op) {
  // The deadline is checked before each poll, not only by it: a peer that keeps the socket
  // ready without letting the caller progress must not outlast it.
  while (Clock::now() < deadline) {
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return;  // readable/writable or an error the next call will report
    if (rc < 0 && errno != EINTR) throw_lost(op, errno);
  }
  throw TimeoutError(
      gw::detail::str("[", op, "] no answer from the store at ", peer_, " before the deadline"));
}

void TcpSocket::send_all(std::initializer_list<const Bytes*> buffers, Clock::time_point deadline,
                         const char* op) {
  if (tls_) {
    // Small messages (most are) are joined to go as one TLS record; large ones are not copied.
    size_t total = 0;
    for (const Bytes* b : buffers) total += b->size();
    if (total <= kJoinBytes) {
      Bytes all;
      all.reserve(total);
      for (const Bytes* b : buffers) all.insert(all.end(), b->begin(), b->end());
      return tls_->write(all.data(), all.size(), tls_wait(deadline, op), op);
    }
    for (const Bytes* b : buffers) tls_->write(b->data(), b->size(), tls_wait(deadline, op), op);
    return;
  }
  std::vector<iovec> iov;
  for (const Bytes* b : buffers)
    if (!b->empty()) iov.push_back({const_cast<uint8_t*>(b->data()), b->size()});
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = iov.size() - first;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // a dead peer must not raise SIGPIPE
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throw_lost(op, errno);
      wait_ready(POLLOUT, deadline, op);
      continue;
    }
    // Advance past what the kernel took.
    auto sent = static_cast<size_t>(n);
    while (first < iov.size() && sent >= iov[first].iov_len) sent -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + sent;
      iov[first].iov_len -= sent;
    }
  }
}

Bytes TcpSocket::recv_exact(size_t n, Clock::time_point deadline, const char* op) {
  Bytes buf(n);
  if (tls_) {
    tls_->read(buf.data(), n, tls_wait(deadline, op), op);
    return buf;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::recv(fd_, buf.data() + done, n - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
    } else if (got == 0) {
      throw_lost(op, 0);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(POLLIN, deadline, op);
    } else if (errno != EINTR) {
      throw_lost(op, errno);
    }
  }
  return buf;
}

}  // namespace gw::store::detail
