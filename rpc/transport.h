// gw::rpc::Transport — an agent's sockets: one listener, one outbound connection per peer, the
// inbound connections peers opened, and the one network thread that serves them all.
//
// Mental model: the network thread never blocks. It accepts, reads frames and hands each
// message to the owner's handler, and it opens outbound connections asynchronously; after its
// last work it looks for more for 50 us before it sleeps, which saves a wake-up per frame of a
// conversation. send()
// from any thread writes a request straight to the peer's open connection (no hop to the
// network thread). To a peer without one, the request is queued and the network thread
// connects; once connected and authenticated it writes our Handshake first, then the queue in
// order. A queued
// request whose deadline passes is handed back as unsent (TimeoutError), and the connect gives
// up when no request is left waiting for it; should it fail, every queued request is handed
// back with the reason (IoError). Responses do not come through here:
// they go back on the connection their request came in on (Connection::send).
//
// Every connection, both ways, opens with the job-key handshake (store/handshake.h), under
// TLS when the options give a context (store/tls.h): an
// accepted connection becomes a Connection, known as its worker's, only once that worker
// proved the key within the handshake timeout; until then nothing is read from it beyond the
// handshake's fixed-size messages, at most `max_unauthenticated` such connections exist at once,
// and a second live connection claiming the same worker is refused. The acceptor survives
// running out of descriptors (it backs off and retries).
//
// Liveness (store/liveness.h): the network thread checks every connection a few times a
// second. One that has sent nothing for heartbeat_period sends a heartbeat; one that has heard
// nothing from its peer for failure_timeout declares that worker dead: all its connections
// close with "worker 'w' at addr:port declared dead: no heartbeat for 10 s (failure_timeout)",
// which fails what is pending on them (the owner's close handler), and from then on requests
// to it fail at once and its connections are refused. Only the network thread sends
// heartbeats, and it runs no request handler but the tiny ones registered to run inline
// (rpc/function_table.h), so a worker busy computing stays alive — but it does run the callbacks of
// futures its responses complete (core/future.h): one that computes for longer than the window
// makes this worker silent. (Over shared memory, connection.h, responses and their callbacks are
// the connection's ring thread's, and a connection whose ring thread is in a handler counts as
// heard. Handlers still run one at a time: the network thread sends no heartbeat while it waits to
// hand over a frame of its own.) A check that itself ran late (this process was stopped or starved)
// declares nobody dead: it cannot tell.
//
//   Transport t(options, handlers);                                 // listening
//   publish(t.port()); ...                                          // rendezvous
//   t.start(peer_endpoints, calls, on_thread_start);                // network thread runs
//   t.send(1, std::move(request), deadline);  // bound in `calls`, or failed there (and unsent)
//   t.stop("shutdown");                                             // closes all, joins
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <asio.hpp>

#include "rpc/call_table.h"
#include "rpc/connection.h"
#include "store/handshake.h"

namespace gw::rpc {

// Where a worker listens, as it published it.
struct PeerAddress {
  std::string name;
  std::string host;  // an IP address
  uint16_t port = 0;
};

class Transport {
 public:
  using Clock = std::chrono::steady_clock;
  using Endpoint = asio::ip::tcp::endpoint;

  struct Options {
    std::string self_name;
    int self_id = -1;
    std::string address;  // listened on: an IP address
    uint64_t max_frame_bytes = 0;
    store::JobKey key = store::JobKey::none();
    std::chrono::milliseconds handshake_timeout{10000};
    int max_unauthenticated = 256;
    store::TlsContext tls;                         // every connection under TLS; null: plain TCP
    std::chrono::milliseconds failure_timeout{0};  // 0: no heartbeats, nobody declared dead
    // Shared memory with workers on this host (rpc/shm.h), rings of this many bytes each way;
    // 0: TCP only.
    uint64_t shm_ring_bytes = 0;
  };

  struct Handlers {
    Connection::MessageHandler on_message;   // network thread
    Connection::CloseHandler on_close;       // network thread; the transport has forgotten it
    std::function<Message(int peer)> hello;  // the Handshake that opens a connection to `peer`
    // Request `m` never left (any thread): undo what was recorded for it before send(). Its
    // call fails right after, with the reason.
    std::function<void(Message& m)> unsent;
  };

  // Listens on options.address (an ephemeral port). Throws IoError if it cannot.
  Transport(Options options, Handlers handlers);
  ~Transport();  // stop()s
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  uint16_t port() const;
  asio::io_context& io() { return io_; }

  // Learns where the peers listen (by worker id) and the table of our calls (which must outlive
  // stop()), and starts the network thread; `on_thread_start` runs first on it. Throws IoError
  // on an address that is not an IP.
  void start(const std::vector<PeerAddress>& peers, CallTable& calls,
             const std::function<void()>& on_thread_start);
  // Sends request `m`, call m.id in the table, to worker `peer`, connecting first if needed,
  // within `deadline` (Clock::time_point::max(): no limit of ours). Never blocks and never
  // throws: the call is bound to the connection the request is written to, or, if it cannot
  // leave, handed to handlers.unsent and then failed in the table.
  void send(int peer, Message m, Clock::time_point deadline);
  // Whether `c` is our open connection to its peer (the one our requests to it go out on).
  bool is_outbound(const std::shared_ptr<Connection>& c) const;
  // What carries our requests to `peer`: "shm", "tcp", or "none" without an open connection.
  std::string link(int peer) const;
  // Why worker `peer` is gone: declared dead, or a connection with it was lost (or could not
  // be opened) and none opened since; empty if neither. (Connections close only on failures,
  // or at stop.)
  std::string gone(int peer) const;
  // Opens a connection to `peer` if there is none, so that its heartbeats are watched (a
  // worker it never called is not); one that fails, or gets no answer within failure_timeout,
  // makes it gone(). Never blocks.
  void probe(int peer);
  // Closes the listener and every connection with `why`, fails what is queued, and joins the
  // network thread. Idempotent; not from the network thread.
  void stop(const std::string& why);

 private:
  struct Queued {
    Message message;
    Clock::time_point deadline;
  };
  // A peer's outbound side: its open connection, or the connect under way and what waits for it.
  struct Peer {
    Endpoint endpoint;
    std::string name;
    std::shared_ptr<Connection> conn;
    bool connecting = false;  // a connect, or the flush of its queue, is under way
    std::deque<Queued> queue;
    std::shared_ptr<store::Stream> socket;          // while connecting
    std::shared_ptr<asio::steady_timer> timer;      // the connect's deadline, if it has one
    bool timed_out = false;
    std::string dead;  // why it was declared dead; then nothing more goes to it
    std::string lost;  // why its last connection closed, until another opens
  };

  // Network thread: `peer` proved the key on `s`; it becomes a connection if it is one of the
  // job's workers without another live connection to us.
  void admit(const std::shared_ptr<store::Stream>& s, const store::auth::Identity& peer,
             const std::string& from);
  void connect(int peer);  // network thread
  void watch_connect(int peer, std::shared_ptr<store::Stream> s,
                     std::shared_ptr<asio::steady_timer> timer);
  // The connect to `peer` ended: its socket authenticated, or why not.
  void connected(int peer, std::shared_ptr<store::Stream> s, std::exception_ptr failed);
  // Hands every request queued for `peer` back as unsent with `why`.
  void fail_queue(int peer, std::exception_ptr why);
  // Caller holds mu_: the requests out of time, taken from the queue; the earliest deadline.
  static std::deque<Queued> take_expired_locked(Peer& p);
  static Clock::time_point earliest_deadline_locked(const Peer& p);
  void expire(int peer, std::deque<Queued>& expired);  // unsent, TimeoutError
  void write(const std::shared_ptr<Connection>& c, Message& m);
  // Request `m` never left because of `why`: handlers.unsent, then its call fails.
  void unsent(Message& m, std::exception_ptr why);
  std::string describe(int peer) const;  // "worker 'w' at addr:port"
  std::shared_ptr<Connection> make_connection(store::Stream s);
  // Network thread, every liveness_check_period: heartbeats out, silent peers declared dead.
  void check_liveness();
  void declare_dead(int peer);

  const Options options_;
  const std::string& self_name_ = options_.self_name;
  Handlers handlers_;
  CallTable* calls_ = nullptr;  // set by start()
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  asio::ip::tcp::acceptor acceptor_{io_};
  std::optional<store::auth::Gatekeeper> door_;  // network thread: admits those who prove the key
  std::thread thread_;
  std::function<void()> on_thread_start_;  // the network thread's, and the ring threads'
  // Messages are handled one at a time, whichever thread (network, ring) delivers them: the
  // handlers were written for one network thread.
  std::mutex handling_mu_;
  const std::shared_ptr<ThreadCount> ring_threads_ = std::make_shared<ThreadCount>();
  asio::steady_timer liveness_{io_};  // network thread
  Clock::time_point last_check_;      // network thread

  mutable std::mutex mu_;
  bool stopping_ = false;
  std::vector<Peer> peers_;  // by worker id
  std::set<std::shared_ptr<Connection>> inbound_;
};

}  // namespace gw::rpc
