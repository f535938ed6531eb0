#include "rpc/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/trace.h"

namespace gw::rpc {

namespace {
constexpr size_t kReadBufferBytes = 64 * 1024;
// Payload left to read beyond this goes straight into tensor storage, not through buf_.
constexpr size_t kDirectReadBytes = 16 * 1024;
constexpr size_t kMaxIov = 512;
// A ring thread with nothing to do keeps looking this long before it sleeps: a round trip's
// answer, or the next request of a busy caller, usually comes within it, and is then taken
// without a wake-up. It yields the core meanwhile.
constexpr auto kRingSpin = std::chrono::microseconds(50);
// ... and sleeps at most this long at a time (a bound, should a wake-up ever be missed).
constexpr auto kRingSleep = std::chrono::milliseconds(1000);
// A peer's socket closed: its last frames in the ring are handed on within this, or dropped.
constexpr auto kDrainLimit = std::chrono::seconds(1);

Message shm_step(SharedMemory::Step step, int32_t pid = 0) {
  Handshake h;
  h.shm.emplace().step = step;
  h.shm->pid = pid;
  Message m;
  m.body = std::move(h);
  return m;
}
}  // namespace

namespace {
thread_local const ThreadCount* t_counted_by = nullptr;  // a ring thread's ThreadCount
}  // namespace

void ThreadCount::add() {
  std::lock_guard lock(mu_);
  ++live_;
}

void ThreadCount::done() {
  std::lock_guard lock(mu_);
  if (--live_ == 0) cv_.notify_all();
}

bool ThreadCount::counts_this_thread() const { return t_counted_by == this; }

void ThreadCount::wait_none() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return live_ == 0; });
}

// A frame's byte ranges still to be written, and the tensors that keep them alive.
struct Connection::Pending {
  OutgoingFrame frame;
  std::vector<iovec> iov;
  size_t next = 0;  // first iov entry not fully written

  explicit Pending(OutgoingFrame f) : frame(std::move(f)) {
    iov.reserve(2 + frame.tensors.size());
    iov.push_back({frame.prefix.data(), frame.prefix.size()});
    if (frame.header.size() > 0)  // a heartbeat has none; empty entries would never finish
      iov.push_back({frame.header.begin(), frame.header.size() * sizeof(capnp::word)});
    for (const auto& t : frame.tensors)
      if (t.nbytes() > 0) iov.push_back({t.raw_data(), t.nbytes()});
  }
  bool done() const { return next == iov.size(); }
  void advance(size_t n) {
    while (n > 0) {
      iovec& v = iov[next];
      size_t take = std::min(n, v.iov_len);
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + take;
      v.iov_len -= take;
      n -= take;
      if (v.iov_len == 0) ++next;
    }
  }
};

Connection::Connection(store::Stream stream, uint64_t max_frame_bytes, MessageHandler on_message,
                       CloseHandler on_close, ShmOptions shm)
    : stream_(std::move(stream)),
      fd_(socket_.native_handle()),
      max_frame_bytes_(max_frame_bytes),
      on_message_(std::move(on_message)),
      on_close_(std::move(on_close)),
      buf_(kReadBufferBytes),
      reader_(max_frame_bytes),
      shm_options_(std::move(shm)),
      drain_limit_(socket_.get_executor()),
      ring_reader_(max_frame_bytes) {
  // Without heartbeats (failure_timeout 0), a peer host that vanished without closing is still
  // noticed within about a minute on an idle connection, so that its worker, back, can connect
  // again (a worker's second live connection is refused). TCP keepalive cannot replace the
  // heartbeat: a stopped process's kernel answers its probes.
  const int on = 1, idle_s = 30, interval_s = 5, probes = 4;
  ::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  // Set once, before any other thread sees the socket: senders write to fd_ themselves.
  socket_.non_blocking(true);
  std::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  remote_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

Connection::~Connection() {
  keep_leases(std::move(leases_), ipc_peer_);  // never closed: nobody told us it copied
}

void Connection::keep_leases(std::map<uint64_t, CudaIpcLease> leases,
                             std::shared_ptr<const CudaIpcPeer> peer) {
  if (leases.empty()) return;
  std::vector<CudaIpcLease> kept;
  for (auto& [id, lease] : leases) kept.push_back(std::move(lease));
  keep_cuda_ipc_leases_until_gone(std::move(kept), std::move(peer));
}

void Connection::start() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_more(); });
}

// --- reading (Asio thread) -------------------------------------------------------------------

void Connection::read_more() {
  if (closed()) return;
  auto self = shared_from_this();
  if (auto direct = reader_.direct_target(kDirectReadBytes); !direct.empty()) {
    // What has arrived so far, not the whole tensor: each read is a sign of life.
    stream_.async_read_some(
        asio::buffer(direct.data(), direct.size()),
        [self](const std::error_code& ec, size_t n) { self->on_read(ec, n, true); });
    return;
  }
  stream_.async_read_some(asio::buffer(buf_), [self](const std::error_code& ec, size_t n) {
    self->on_read(ec, n, false);
  });
}

void Connection::on_read(const std::error_code& ec, size_t n, bool direct) {
  if (ec) {
    std::string why = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated
                          ? "the peer closed the connection"
                          : ec.message();
    const bool peer_closed = ec == asio::error::eof || ec == asio::error::connection_reset;
    if (peer_closed && shm_in_.load() && !closed()) {
      // Frames the peer wrote into the ring before its socket closed come first; nothing more
      // goes out. Should the ring thread be held in a handler, the close comes at the limit.
      {
        std::lock_guard lock(write_mu_);
        close_started_ = true;
        shm_queue_.clear();
      }
      peer_closed_why_ = std::move(why);
      peer_closed_.store(true, std::memory_order_release);
      shm_->wake_self();
      drain_limit_.expires_after(kDrainLimit);
      drain_limit_.async_wait([self = shared_from_this()](const std::error_code& e) {
        if (!e) self->close_on_io_thread(self->peer_closed_why_);
      });
      return;
    }
    close_on_io_thread(why);
    return;
  }
  last_heard_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  try {
    if (direct) {
      reader_.direct_filled(n);
      deliver();
    } else {
      // A handler may close the connection: the rest of the buffer is then left unread.
      for (const uint8_t* data = buf_.data(); n > 0 && !closed();) {
        const size_t used = reader_.feed(data, n);
        data += used, n -= used;
        deliver();
      }
    }
  } catch (const std::exception& e) {
    log_error("closing connection from ", remote_, ": ", e.what());
    close_on_io_thread(e.what());
    return;
  }
  read_more();
}

void Connection::deliver() {
  auto m = reader_.take();
  if (!m) return;
  // From the switch on, frames come through the ring: one on the socket could overtake them.
  GW_CHECK(!shm_in_.load(), IoError, "[rpc] ", remote_,
           " sent a frame on the socket after switching to shared memory");
  if (const auto* h = m->get<Handshake>(); h && h->shm && !on_shm_step(*m)) return;
  if (!on_cuda_ipc(*m)) return;
  on_message_(shared_from_this(), std::move(*m));
}

// --- CUDA tensors shared by IPC handle ---------------------------------------------------------

// The receipt of a message whose CUDA tensors the peer shared: copies happen while the
// connection is open, and its end (the peer's release) waits for them.
class Connection::Receipt final : public CudaIpcReceipt {
 public:
  Receipt(std::weak_ptr<Connection> connection, uint64_t lease, int64_t sender)
      : connection_(std::move(connection)), lease_(lease), sender_(sender) {}

  // Tells the peer that it may have its memory back; a closed connection needs no telling.
  ~Receipt() override {
    const auto c = connection_.lock();
    if (!c || c->closed()) return;
    Handshake h;
    h.cuda_ipc_released = {lease_};
    Message release;
    release.body = std::move(h);
    try {
      c->send(release);
    } catch (const std::exception&) {  // closed meanwhile
    }
  }

  void while_open(const std::function<void()>& copy) override {
    const auto c = connection_.lock();
    const char* closed =
        "[rpc] the connection that brought these CUDA tensors closed before "
        "they were copied: the sender may have reused their memory";
    GW_CHECK(c, IoError, closed);
    std::shared_lock copying(c->copying_mu_);
    GW_CHECK(!c->closed(), IoError, closed);
    copy();
  }

  int64_t sender() const override { return sender_; }

 private:
  std::weak_ptr<Connection> connection_;
  uint64_t lease_;
  int64_t sender_;
};

bool Connection::on_cuda_ipc(Message& m) {
  if (const auto* h = m.get<Handshake>(); h && !h->cuda_ipc_released.empty()) {
    std::vector<CudaIpcLease> done;  // dropped outside the lock
    std::lock_guard lock(write_mu_);
    for (uint64_t id : h->cuda_ipc_released)
      if (auto node = leases_.extract(id)) done.push_back(std::move(node.mapped()));
    return false;
  }
  if (m.cuda_ipc_lease == 0) return true;
  // Only a peer that shared memory showed to be another process of this host may share.
  GW_CHECK(cuda_ipc_.load(std::memory_order_acquire), IoError, "[rpc] ", remote_,
           " shared CUDA tensors by IPC handle, but it is not another process of this host");
  m.cuda_ipc_receipt =
      std::make_shared<Receipt>(weak_from_this(), m.cuda_ipc_lease, peer_pid_.load());
  return true;
}

void Connection::on_peer_process(int32_t pid) {
  GW_CHECK(pid > 0, IoError, "[rpc] ", remote_, " named process ", pid);
  if (pid == ::getpid()) return;  // another agent of this process: its tensors go as bytes
  peer_pid_ = pid;
  cuda_ipc_.store(true, std::memory_order_release);
}

// --- shared memory ---------------------------------------------------------------------------

void Connection::offer_shm(Message& hello) {
  if (shm_options_.ring_bytes == 0 || stream_.is_tls()) return;
  // Only to an address of this host (loopback, or the one this end has).
  std::error_code ec1, ec2;
  const auto there = socket_.remote_endpoint(ec1).address();
  const auto here = socket_.local_endpoint(ec2).address();
  if (ec1 || ec2 || !(there.is_loopback() || there == here)) return;
  try {
    shm_ = shm::Segment::create(shm_options_.ring_bytes);
  } catch (const std::exception& e) {
    log_error("not offering shared memory to ", remote_, ": ", e.what());
    return;
  }
  const shm::Offer o = shm_->offer();
  hello.get<Handshake>()->shm =
      SharedMemory{SharedMemory::Step::kOffer, o.host, o.pid, o.fd, o.ring_bytes, o.token};
  shm_offered_ = true;
}

const char* Connection::link() const { return shm_in_.load() ? "shm" : "tcp"; }

bool Connection::on_shm_step(Message& m) {
  Handshake& h = *m.get<Handshake>();
  const SharedMemory step = std::move(*h.shm);
  h.shm.reset();
  using Step = SharedMemory::Step;
  switch (step.step) {
    case Step::kOffer: {
      GW_CHECK(!shm_offered_ && !shm_, IoError, "[rpc] a shared-memory offer from ", remote_,
               ", which did not open this connection");
      std::unique_ptr<shm::Segment> seg;
      if (shm_options_.ring_bytes > 0 && !stream_.is_tls()) {
        try {
          seg = shm::Segment::attach({step.host, step.pid, step.fd, step.ring_bytes, step.token});
        } catch (const std::exception& e) {
          // Worth a line only on one host, where the speed was expected.
          if (step.host == shm::host_identity())
            log_error("staying on TCP with ", remote_, ": ", e.what());
        }
      }
      {
        std::lock_guard lock(write_mu_);
        if (close_started_) return false;
        if (!seg) {
          enqueue_locked(std::make_unique<Pending>(encode(shm_step(Step::kDecline))));
          return true;
        }
        shm_ = std::move(seg);
        enqueue_locked(std::make_unique<Pending>(encode(shm_step(Step::kAccept, ::getpid()))));
        shm_out_ = true;  // the peer reads the ring after our kAccept
      }
      on_peer_process(step.pid);
      start_ring_thread();
      return true;  // the opener's Handshake, for the agent
    }
    case Step::kAccept: {
      GW_CHECK(shm_offered_ && shm_ && !shm_in_, IoError,
               "[rpc] an unasked shared-memory accept from ", remote_);
      shm_->close_fd();  // mapped by the peer
      {
        std::lock_guard lock(write_mu_);
        if (close_started_) return false;
        enqueue_locked(std::make_unique<Pending>(encode(shm_step(Step::kSwitch))));
        shm_out_ = true;
      }
      on_peer_process(step.pid);
      shm_in_ = true;  // what the peer sent after its kAccept is in the ring
      start_ring_thread();
      return false;
    }
    case Step::kDecline:
      GW_CHECK(shm_offered_ && shm_ && !shm_in_, IoError,
               "[rpc] an unasked shared-memory decline from ", remote_);
      shm_.reset();
      shm_offered_ = false;
      return false;
    case Step::kSwitch:
      GW_CHECK(!shm_offered_ && shm_ && !shm_in_, IoError,
               "[rpc] an unasked shared-memory switch from ", remote_);
      shm_in_ = true;
      shm_->wake_self();
      return false;
  }
  return false;
}

void Connection::start_ring_thread() {
  auto threads = shm_options_.threads;
  threads->add();
  try {
    std::thread([self = shared_from_this(), threads]() mutable {
      t_counted_by = threads.get();
      if (self->shm_options_.on_thread_start) self->shm_options_.on_thread_start();
      self->ring_loop();
      self.reset();  // before done(): the connection may not outlive its owner's wait
      threads->done();
    }).detach();
  } catch (const std::exception& e) {
    threads->done();
    close_on_io_thread(std::string("cannot start the shared-memory thread: ") + e.what());
  }
}

void Connection::ring_loop() {
  auto last_work = Clock::now();
  auto ready = [this] {
    try {
      return closed() || peer_closed_.load() || (shm_in_.load() && !shm_->readable().empty()) ||
             (shm_queued_.load() && !shm_->out_full());
    } catch (const std::exception&) {
      return true;  // a corrupted ring: the loop finds out
    }
  };
  while (!closed()) {
    bool worked = false;
    try {
      if (peer_closed_.load(std::memory_order_acquire)) {
        // The peer is gone: the ring holds all it will ever write (bounded).
        while (!closed() && read_ring()) {
        }
        close(peer_closed_why_);
        return;
      }
      if (shm_in_.load(std::memory_order_acquire)) worked = read_ring();
      if (shm_queued_.load()) {
        std::lock_guard lock(write_mu_);
        if (close_started_)
          shm_queued_ = false;  // being closed: nothing more goes out
        else if (write_ring_locked())
          worked = true;
      }
    } catch (const std::exception& e) {
      log_error("closing connection from ", remote_, ": ", e.what());
      close(e.what());
      return;
    }
    const auto now = Clock::now();
    if (worked) {
      last_work = now;
    } else if (now - last_work < kRingSpin) {
      std::this_thread::yield();
    } else {
      shm_->sleep(ready, kRingSleep);
    }
  }
}

bool Connection::read_ring() {
  auto bytes = shm_->readable();
  if (bytes.empty()) return false;
  last_heard_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  const uint8_t* data = bytes.data();
  size_t n = bytes.size();
  while (n > 0 && !closed()) {
    // The reader copies what it takes (the peer can still write to the segment): the room is
    // the writer's again before the message is handled.
    const size_t used = ring_reader_.feed(data, n);
    data += used, n -= used;
    shm_->consume(used);
    if (auto m = ring_reader_.take(); m && on_cuda_ipc(*m)) {
      in_handler_.store(true, std::memory_order_release);
      struct Done {
        std::atomic<bool>& flag;
        ~Done() { flag = false; }
      } done{in_handler_};
      on_message_(shared_from_this(), std::move(*m));
      last_heard_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
  }
  return true;
}

bool Connection::write_ring_locked() {
  bool wrote = false;
  while (!shm_queue_.empty()) {
    Pending& p = *shm_queue_.front();
    while (!p.done()) {
      iovec& v = p.iov[p.next];
      const size_t n = shm_->write(static_cast<const uint8_t*>(v.iov_base), v.iov_len);
      if (n == 0) return wrote;  // full: the ring thread writes the rest when there is room
      wrote = true;
      p.advance(n);
    }
    shm_queue_.pop_front();
  }
  shm_queued_ = false;
  return wrote;
}

// --- writing (any thread) -------------------------------------------------------------------

void Connection::send(const Message& m) {
  const uint64_t lease_id = cuda_ipc_.load(std::memory_order_acquire) ? ++last_lease_ : 0;
  OutgoingFrame frame = [&] {
    trace::Scope span("rpc", "encode");
    return encode(m, lease_id);
  }();
  CudaIpcLease lease = std::move(frame.lease);
  // Refused here rather than by the peer, which would close the connection and fail every
  // call pending on it.
  const size_t bytes = frame.total_bytes() - frame.prefix.size();
  GW_CHECK(bytes <= max_frame_bytes_, InvalidArgumentError, "[rpc] a message of ", bytes,
           " bytes to ", remote_, " exceeds max_frame_bytes ", max_frame_bytes_,
           " (RpcBackendOptions::max_frame_bytes, the same on every worker)");
  auto pending = std::make_unique<Pending>(std::move(frame));
  std::lock_guard lock(write_mu_);
  GW_CHECK(!close_started_, IoError, "[rpc] connection to ", remote_, " is closed");
  if (!lease.empty()) {
    // Watched from the first lease on (a pidfd), should we have to keep leases for it.
    if (!ipc_peer_) ipc_peer_ = std::make_shared<const CudaIpcPeer>(peer_pid_.load());
    leases_.emplace(lease_id, std::move(lease));
  }
  enqueue_locked(std::move(pending));
}

void Connection::send_heartbeat() {
  auto beat = std::make_unique<Pending>(heartbeat_frame());
  std::lock_guard lock(write_mu_);
  // Frames still queued are on their way; the peer hears those.
  if (!close_started_ && (shm_out_ ? shm_queue_ : queue_).empty()) enqueue_locked(std::move(beat));
}

void Connection::enqueue_locked(std::unique_ptr<Pending> pending) {
  last_sent_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  if (shm_out_) {
    shm_queue_.push_back(std::move(pending));
    if (shm_queue_.size() > 1) return;  // the ring thread writes the queue
    try {
      write_ring_locked();
    } catch (const std::exception& e) {
      close_started_ = true;
      shm_queued_ = false;
      asio::post(socket_.get_executor(), [self = shared_from_this(), why = std::string(e.what())] {
        self->close_on_io_thread(why);
      });
      return;
    }
    if (!shm_queue_.empty()) {
      shm_queued_ = true;
      shm_->notify_self();
    }
    return;
  }
  queue_.push_back(std::move(pending));
  if (queue_.size() > 1 || waiting_writable_) return;  // the Asio thread is draining the queue
  if (stream_.is_tls()) {
    waiting_writable_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->write_tls(); });
    return;
  }
  if (!write_queued_locked()) return;
  if (!queue_.empty()) wait_writable();
}

bool Connection::write_queued_locked() {
  while (!queue_.empty()) {
    Pending& p = *queue_.front();
    while (!p.done()) {
      msghdr msg{};
      msg.msg_iov = p.iov.data() + p.next;
      msg.msg_iovlen = std::min(p.iov.size() - p.next, kMaxIov);
      ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        std::string why = std::string("send failed: ") + std::strerror(errno);
        close_started_ = true;
        asio::post(socket_.get_executor(),
                   [self = shared_from_this(), why] { self->close_on_io_thread(why); });
        return false;
      }
      p.advance(static_cast<size_t>(n));
    }
    queue_.pop_front();
  }
  return true;
}

void Connection::wait_writable() {
  waiting_writable_ = true;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    if (self->closed()) return;
    self->socket_.async_wait(asio::socket_base::wait_write, [self](const std::error_code& ec) {
      if (ec && ec != asio::error::operation_aborted) {
        self->close_on_io_thread("waiting to write failed: " + ec.message());
        return;
      }
      std::lock_guard lock(self->write_mu_);
      self->waiting_writable_ = false;
      if (ec || self->close_started_) return;
      if (self->write_queued_locked() && !self->queue_.empty()) self->wait_writable();
    });
  });
}

// Asio thread, TLS: writes the queue through the TLS stream as one gathered batch (Asio joins
// small buffers into one TLS record), then what was queued meanwhile, until the queue is empty.
void Connection::write_tls() {
  {
    std::lock_guard lock(write_mu_);
    if (close_started_) return;
    if (queue_.empty()) {
      waiting_writable_ = false;
      return;
    }
    writing_.swap(queue_);  // writing_ is empty: the previous batch is done
  }
  std::vector<asio::const_buffer> buffers;
  for (const auto& p : writing_)
    for (const iovec& v : p->iov) buffers.emplace_back(v.iov_base, v.iov_len);
  asio::async_write(stream_, buffers,
                    [self = shared_from_this()](const std::error_code& ec, size_t) {
                      self->writing_.clear();
                      if (ec) return self->close_on_io_thread("send failed: " + ec.message());
                      self->write_tls();
                    });
}

// --- closing ---------------------------------------------------------------------------------

void Connection::close(const std::string& why) {
  asio::post(socket_.get_executor(),
             [self = shared_from_this(), why] { self->close_on_io_thread(why); });
}

void Connection::close_on_io_thread(const std::string& why) {
  if (closed_.exchange(true)) return;
  // Copies out of the peer's memory that began before the close end before the peer sees it:
  // it lets go of that memory then.
  { std::unique_lock copies_done(copying_mu_); }
  std::map<uint64_t, CudaIpcLease> leases;  // what we shared with the peer, dropped unlocked
  std::shared_ptr<const CudaIpcPeer> peer;
  {
    // Senders use fd_ under write_mu_: close it under the same lock so the number is not
    // reused beneath them.
    std::lock_guard lock(write_mu_);
    close_started_ = true;
    queue_.clear();
    shm_queue_.clear();
    leases.swap(leases_);
    peer = ipc_peer_;
    std::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    socket_.close(ignored);
  }
  drain_limit_.cancel();
  if (shm_) shm_->wake_self();  // its ring thread ends
  if (cuda_ipc_) {
    // What we opened of the peer's memory would keep it from being freed should it be gone.
    forget_cuda_ipc_sender(peer_pid_);
    // The peer is done copying ours once it has closed its end (see copying_mu_). Closed from
    // this end, we cannot know: what it may still copy stays until its process is gone.
    if (!peer_closed_.load()) keep_leases(std::move(leases), std::move(peer));
  }
  on_close_(shared_from_this(), why);
}

}  // namespace gw::rpc
