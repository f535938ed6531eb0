// gw::rpc::Agent — one worker's endpoint in an RPC group: the object behind init_rpc.
//
// Mental model (PyTorch's RpcAgent): every worker has a name and an id (its rank). At start the
// agent listens on a TCP port and publishes "name, address" in the rendezvous Store, then reads
// everyone else's. Connections open on demand, one per caller->callee direction, starting with
// a handshake. A request is run by the callee's pool of `num_worker_threads` threads using the
// function table (or, for a function registered to run inline, by the thread that read it); its
// response, which only the connection the request went out on can carry,
// completes the caller's Future. A call fails on its Future with gw::TimeoutError after its
// timeout, with gw::IoError as soon as the connection to the callee drops, and with
// gw::RemoteError (naming the callee) when the function threw there: a gw::Error keeps its type
// (a remote InvalidArgumentError is an InvalidArgumentError and a RemoteError, core/error.h).
//
// Inside, the agent is three parts and a list of interceptors, each in its own header:
//   Transport   (rpc/transport.h)   sockets and the network thread, which never blocks: requests
//                                   are written by the calling thread, connects are asynchronous;
//                                   it binds each call to its connection (or fails it) itself
//   CallTable   (rpc/call_table.h)  pending calls, their deadlines and the connection each is
//                                   bound to; the only place a response completes a call
//   Dispatcher  (rpc/dispatcher.h)  the pool that runs request handlers (inline ones on the
//                                   reading thread), device placement of received CUDA
//                                   tensors included
//   Interceptor (rpc/interceptor.h) how the RRef protocol and distributed autograd see every
//                                   message sent and received
// The agent itself routes: a request's variant picks its handler (on_request), a response goes
// to the call table. A call goes agent -> call table (add) -> transport -> connection, and
// comes back only if its request could not leave (the interceptors undo what they recorded).
//
// Most code uses the free functions in rpc/api.h (init_rpc, rpc_sync, ...), which act on the
// process's default agent, or on the agent running the current request handler. Tests create
// several agents in one process (threads as ranks) sharing a HashStore.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/future.h"
#include "debug/flight_recorder.h"
#include "rpc/function_table.h"
#include "rpc/interceptor.h"
#include "rpc/ivalue.h"
#include "rpc/protocol.h"
#include "store/job_key.h"
#include "store/liveness.h"
#include "store/store.h"
#include "store/tls.h"

namespace gw::rpc {

class Agent;
class AutogradHook;
class CallTable;
class Connection;
class Dispatcher;
class Interceptor;
class RRefContext;
class RRefHandle;
class Transport;
struct PeerAddress;

using Milliseconds = std::chrono::milliseconds;
inline constexpr Milliseconds kDefaultRpcTimeout{60000};
// A per-call timeout of zero means no timeout; kUseDefaultTimeout means the agent's default.
inline constexpr Milliseconds kNoTimeout{0};
inline constexpr Milliseconds kUseDefaultTimeout{-1};

struct RpcBackendOptions {
  int num_worker_threads = 16;
  Milliseconds rpc_timeout = kDefaultRpcTimeout;
  // Rendezvous: "env://" (MASTER_ADDR, MASTER_PORT), "tcp://host:port" or "file:///path".
  std::string init_method = "env://";
  // If set, used instead of init_method (e.g. a HashStore shared by threads as ranks).
  std::shared_ptr<store::Store> store;
  // The address this worker listens on and publishes to the others: an IP address or a host
  // name. Empty: the address of the interface GW_SOCKET_IFNAME names, else of the one that
  // routes to the master (init_method's host; loopback for a job on this host alone, or with
  // a `store` given).
  std::string address;
  // A message larger than this (header + tensors) is not sent (its call fails with
  // InvalidArgumentError); one received closes its connection. The same on every worker.
  uint64_t max_frame_bytes = uint64_t{1} << 30;

  // Security (README "Security"). Every connection, and the rendezvous store's, proves the job
  // key before anything else (store/job_key.h): this one, else GW_JOB_KEY_FILE's. Without
  // a key, `address` must be loopback unless allow_unauthenticated (or
  // GW_ALLOW_UNAUTHENTICATED=1) declares the network trusted.
  std::optional<store::JobKey> job_key;
  bool allow_unauthenticated = false;
  // A connection that has not proved the key by then is closed ...
  Milliseconds handshake_timeout{10000};
  // ... and beyond this many such connections at once, each new one closes the oldest of
  // those from the busiest address. (The rendezvous TCPStore gets both limits too.)
  int max_unauthenticated_connections = 256;
  // TLS on every connection, and the rendezvous store's (store/tls.h): these files, else
  // GW_TLS_CERT_FILE / GW_TLS_KEY_FILE / GW_TLS_CA_FILE; none: plain TCP. The same on every
  // worker.
  store::TlsOptions tls;
  // Liveness (README "When things fail"): a worker this one is connected to that sends nothing
  // for this long (heartbeats included) is declared dead, which fails every call, distributed
  // autograd pass and RRef operation pending on it with IoError "no heartbeat for N s";
  // requests to it then fail at once. A worker busy computing still sends heartbeats (its
  // network thread does; keep future callbacks short: they run on the thread that delivers
  // responses, the network thread or a shared-memory connection's own). The same on every
  // worker. Default: GW_FAILURE_TIMEOUT (seconds), else 10 s; 0: never.
  Milliseconds failure_timeout = store::kFailureTimeoutFromEnv;
  // Calls, remote() creations and distributed autograd requests from one worker being served
  // at once; beyond, a new call fails at once on its caller with StateError (a remote()'s
  // value fails with it, seen at to_here()).
  int max_pending_requests_per_peer = 4096;
  // Where this worker's CUDA tensors go on each callee: device_maps["worker1"] = {{0, 1}} puts
  // a tensor sent from cuda:0 on worker1's cuda:1 (staged through host memory). Responses, and
  // a callee's requests back without a map of its own, follow the inverse map. A CUDA tensor
  // on a device its destination's map lacks cannot be sent.
  std::map<std::string, std::map<int, int>> device_maps;
  // Same-host speed (README "RPC between workers on one host"): a connection whose two workers
  // are on one host (same boot, network and pid namespaces, and user) carries its frames
  // through shared memory, rings of shm_ring_bytes each way, instead of loopback TCP; its
  // socket stays open to tell when the peer dies. Not under TLS. Unset: on, unless
  // GW_RPC_SHM=0. Each side decides for its own connections, and a side that does not want it
  // declines.
  std::optional<bool> shared_memory;
  uint64_t shm_ring_bytes = uint64_t{4} << 20;
  // What the layers above rpc install on the agent while it is constructed, in order, before
  // any request can arrive: gw::dist::init_rpc passes distributed autograd's (dist/init_rpc.h).
  std::vector<std::function<void(Agent&)>> extensions;
  // Adds entries to device_maps[to]; throws unless the map stays invertible.
  void set_device_map(const std::string& to, const std::map<int, int>& map);
};

struct WorkerInfo {
  std::string name;
  int id = -1;
  bool operator==(const WorkerInfo&) const = default;
};

// The destination of a call: a worker's name, id (rank) or WorkerInfo.
struct To {
  std::variant<std::string, int, WorkerInfo> worker;
  To(const char* name) : worker(std::string(name)) {}  // NOLINT: implicit on purpose
  To(std::string name) : worker(std::move(name)) {}    // NOLINT
  To(int id) : worker(id) {}                           // NOLINT
  To(WorkerInfo info) : worker(std::move(info)) {}     // NOLINT
};

class Agent {
 public:
  // Joins the group: listens, rendezvouses through the store, and returns once every worker
  // has published its address. Throws InvalidArgumentError on a bad name or rank, and
  // TimeoutError if the others do not show up within the store's timeout.
  Agent(std::string name, int rank, int world_size, RpcBackendOptions options = {});
  ~Agent();  // a local (non-graceful) shutdown if shutdown() was not called
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const WorkerInfo& get_worker_info() const { return self_; }
  const WorkerInfo& get_worker_info(const std::string& name) const;
  const WorkerInfo& get_worker_info(int id) const;
  const WorkerInfo& resolve(const To& to) const;
  std::vector<WorkerInfo> get_worker_infos() const { return workers_; }
  const RpcBackendOptions& options() const { return options_; }
  Milliseconds rpc_timeout() const { return Milliseconds(rpc_timeout_ms_.load()); }
  void set_rpc_timeout(Milliseconds t) { rpc_timeout_ms_.store(t.count()); }

  // Sends a request to run `function` on `to`; the future completes with its result.
  Future<IValue> call(const To& to, const std::string& function, IValueList args,
                      Milliseconds timeout = kUseDefaultTimeout);
  // Sends any request of the protocol (rpc/protocol.h: a Call, the RRef protocol's and
  // distributed autograd's messages) to `to`, as call() does; the future completes with the
  // response's value.
  Future<IValue> request(const To& to, Request r, Milliseconds timeout = kUseDefaultTimeout);

  // Runs `function` on `to`, which keeps the result and owns it; returns this worker's
  // reference (see rpc/rref_context.h for the protocol). A failure or timeout of the creation
  // fails the handle's confirmation and surfaces on to_here().
  std::shared_ptr<RRefHandle> remote(const To& to, const std::string& function, IValueList args,
                                     Milliseconds timeout = kUseDefaultTimeout);
  // The value an RRef refers to: the owner's own future, or a fetch from the owner.
  Future<IValue> fetch(const std::shared_ptr<RRefHandle>& rref,
                       Milliseconds timeout = kUseDefaultTimeout);
  RRefContext& rrefs() { return *rrefs_; }
  // Distributed autograd's hook (rpc/autograd_hook.h); nullptr when no extension installed one.
  AutogradHook* autograd_hook() const { return autograd_.get(); }
  // Installs it: only an extension (RpcBackendOptions::extensions), during construction
  // (StateError once running).
  void set_autograd_hook(std::shared_ptr<AutogradHook> hook);
  // How many values this worker owns that are still referenced (0 after a graceful shutdown).
  size_t num_owner_rrefs() const;
  // Responses dropped because they did not arrive on the connection their call went out on.
  uint64_t num_stray_responses() const;
  // What carries this worker's requests to `to` now: "shm" (shared memory), "tcp", or "none"
  // (no open connection: nothing sent to it yet, or lost).
  std::string link(const To& to) const;

  // graceful: waits for this worker's outstanding calls, then for every worker to reach
  // shutdown and finish its work, then stops. Otherwise stops now and fails pending calls.
  // A graceful shutdown takes at most `timeout` (0, the default: no limit, as in PyTorch): if a
  // worker does not confirm by then, is declared dead, or its connection is lost meanwhile,
  // this worker stops anyway (everything local released) and throws TimeoutError, or IoError
  // when a worker is gone, naming the workers that did not confirm.
  void shutdown(bool graceful = true, Milliseconds timeout = kNoTimeout);
  bool running() const { return running_.load(); }

  // The agent whose thread this is (a request handler, a callback on its network thread), or
  // nullptr.
  static Agent* current();
  // Makes `agent` this thread's current agent until destroyed (several agents in one process).
  class Use {
   public:
    explicit Use(Agent& agent);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    Agent* previous_;
  };

 private:
  // Publishes this worker's address and learns everyone's (by worker id).
  std::vector<PeerAddress> rendezvous(int world_size);
  using Clock = std::chrono::steady_clock;
  // The graceful part of shutdown, each step bounded by `deadline`: empty if it completed, else
  // why not.
  std::string drain(Clock::time_point deadline);
  // Waits for every worker to reach `phase`: empty, else who did not by `deadline`.
  std::string barrier(const std::string& phase, Clock::time_point deadline);
  // Why each worker declared dead, or whose connection was lost (and not opened again), is
  // gone; joined, empty if none.
  std::string gone_workers() const;
  void stop(const std::string& why);

  // Network thread: what the transport delivers.
  void on_message(const std::shared_ptr<Connection>& c, Message m);
  void on_close(const std::shared_ptr<Connection>& c, const std::string& why);
  void on_response(const std::shared_ptr<Connection>& c, Message m);
  // Routes a request on its variant: calls and distributed autograd's requests to the pool,
  // the RRef protocol's handled here, in arrival order (agent_rrefs.cpp).
  void on_request(const std::shared_ptr<Connection>& c, Message m);
  // `arrival_failed`: receive() threw for it (an RRefCreate still registers its fork and fails
  // the value with it).
  void on_rref_request(const std::shared_ptr<Connection>& c, const std::shared_ptr<Message>& m,
                       std::exception_ptr arrival_failed = nullptr);

  // The interceptors' passes (rpc/interceptor.h). outgoing() undoes itself if it throws.
  void outgoing(int to, Message& m, uint64_t autograd_context);
  void cancelled(Message& m);
  // Network thread: a message from `from` arrived; the interceptors see it (its CUDA tensors
  // are placed later, by whoever handles it).
  void receive(int from, Message& m, Arrival arrival);

  // A request to serve: message `id` from worker `from`, described as `what` (describe()) in
  // the flight recorder and the trace; `counted` against max_pending_requests_per_peer.
  struct Served {
    int from;
    uint64_t id;
    std::string what;
    bool counted = true;
    bool answer_flow = true;  // the trace's arrow to the answer: not for remote(), answered first
    Runs runs = Runs::kOnPool;  // kInline: on this thread, the one that read it
  };
  // Runs `handler` on the pool in distributed autograd context `ctx`; `done` gets its outcome.
  // A counted request over max_pending_requests_per_peer for its worker gets the refusal in
  // `done` at once instead.
  void serve(const Served& request, uint64_t ctx, std::function<Future<IValue>()> handler,
             std::function<void(Future<IValue>&)> done);
  // One more request of `from` among those being served, or why not (then none was taken).
  std::exception_ptr take_serving_slot(int from);
  // Runs `function` on the pool in distributed autograd context `autograd_context`.
  void run_function(std::string function, IValueList args, uint64_t autograd_context,
                    std::function<void(Future<IValue>&)> done);
  // Sends the outcome of `result` (done) as the response to request `id`, in distributed
  // autograd context `autograd_context` (0: none).
  void respond(const std::shared_ptr<Connection>& c, uint64_t id, Future<IValue>& result,
               uint64_t autograd_context = 0);
  // This agent's section of get_debug_info() (agent_debug.cpp): its pool, pending calls, the
  // requests it serves per worker, the values it owns.
  std::string debug_json() const;
  // Checks options_.device_maps and makes maps_to_ of them.
  void load_device_maps();
  // Where CUDA tensors sent to `peer` go: this worker's device map toward it or, for replies
  // (and requests without a map of their own), the inverse of the peer's map toward this one.
  DeviceMap device_map_to(int peer, bool reply);

  RpcBackendOptions options_;
  WorkerInfo self_;
  std::vector<WorkerInfo> workers_;
  std::unordered_map<std::string, int> ids_;
  std::atomic<int64_t> rpc_timeout_ms_;
  std::atomic<bool> running_{false};
  std::shared_ptr<store::Store> store_;
  // Declared before what uses its network thread (the call table's timer), so destroyed after.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<CallTable> calls_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::shared_ptr<RRefContext> rrefs_;
  std::shared_ptr<AutogradHook> autograd_;
  std::vector<Interceptor*> interceptors_;  // rrefs_, then autograd_ when installed
  std::vector<DeviceMap> maps_to_;          // by worker id: options.device_maps
  std::mutex maps_mu_;
  std::vector<DeviceMap> maps_back_;  // by worker id: the inverse of its map to us (handshake)
  // By worker id: its requests being served (max_pending_requests_per_peer).
  std::unique_ptr<std::atomic<int>[]> serving_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> stray_responses_{0};
  // Last: removed from get_debug_info() before the parts it reads go.
  debug::Section debug_section_;
};

}  // namespace gw::rpc
