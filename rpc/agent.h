// gw::rpc::Agent — one worker's endpoint in an RPC group: the object behind init_rpc.
//
// Mental model (PyTorch's RpcAgent): every worker has a name and an id (its rank). At start the
// agent listens on a TCP port and publishes "name, address" in the rendezvous Store, then reads
// everyone else's. Connections open on demand, one per caller->callee direction, starting with
// a handshake. A request is run by the callee's pool of `num_worker_threads` threads using the
// function table; its response, which only the connection the request went out on can carry,
// completes the caller's Future. A call fails on its Future with gw::TimeoutError after its
// timeout, with gw::IoError as soon as the connection to the callee drops, and with
// gw::RemoteError (naming the callee) when the function threw there: a gw::Error keeps its type
// (a remote InvalidArgumentError is an InvalidArgumentError and a RemoteError, core/error.h).
//
// Most code uses the free functions in rpc/api.h (init_rpc, rpc_sync, ...), which act on the
// process's default agent, or on the agent running the current request handler. Tests create
// several agents in one process (threads as ranks) sharing a HashStore.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/future.h"
#include "dist/store/store.h"
#include "rpc/ivalue.h"
#include "rpc/protocol.h"

namespace gw::rpc {

class AutogradHook;
class Connection;
struct PendingCall;
class RRefContext;
class RRefHandle;
class ThreadPool;

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
  std::shared_ptr<dist::Store> store;
  // The address this worker listens on and publishes to the others.
  std::string address = "127.0.0.1";
  // Frames larger than this (header + tensors) are refused and close the connection.
  uint64_t max_frame_bytes = uint64_t{4} << 30;
  // Where this worker's CUDA tensors go on each callee: device_maps["worker1"] = {{0, 1}} puts
  // a tensor sent from cuda:0 on worker1's cuda:1 (staged through host memory). Responses, and
  // a callee's requests back without a map of its own, follow the inverse map. A CUDA tensor
  // on a device its destination's map lacks cannot be sent.
  std::map<std::string, std::map<int, int>> device_maps;
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
  // Sends any request of the protocol (rpc/message.h: a Call, the RRef protocol's and
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
  // Distributed autograd's hook (rpc/autograd_hook.h); nullptr when it is not linked in.
  AutogradHook* autograd_hook() const { return autograd_.get(); }
  // Installs it: only gw_rpc_extend_agent, during construction (StateError once running).
  void set_autograd_hook(std::shared_ptr<AutogradHook> hook);
  // How many values this worker owns that are still referenced (0 after a graceful shutdown).
  size_t num_owner_rrefs() const;
  // Responses dropped because they did not arrive on the connection their call went out on.
  uint64_t num_stray_responses() const;

  // graceful: waits for this worker's outstanding calls, then for every worker to reach
  // shutdown and finish its work, then stops. Otherwise stops now and fails pending calls.
  void shutdown(bool graceful = true);
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
  void rendezvous(int world_size);
  void accept_next();
  // The connection to worker `id`, opened if there is none; connecting gives up after
  // `timeout` (0: no limit of ours) with TimeoutError.
  std::shared_ptr<Connection> connection_to(int id, Milliseconds timeout);
  void on_message(const std::shared_ptr<Connection>& c, Message m);
  void on_close(const std::shared_ptr<Connection>& c, const std::string& why);
  // The RRef protocol's requests, handled on the network thread in arrival order.
  void handle_rref(const std::shared_ptr<Connection>& c, uint64_t id, uint64_t autograd_ctx,
                   Request& r);
  // Runs distributed autograd's `handle` of a request on the pool and answers with its outcome.
  void serve_autograd(const std::shared_ptr<Connection>& c, uint64_t id,
                      std::function<Future<IValue>()> handle);
  // Runs `work` on the pool with distributed autograd context `autograd_ctx` (0: none)
  // current; `done` receives its outcome.
  void run_on_pool(std::function<Future<IValue>()> work, uint64_t autograd_ctx,
                   std::function<void(Future<IValue>&)> done);
  void run_function(const std::string& function, IValueList args, uint64_t autograd_ctx,
                    std::function<void(Future<IValue>&)> done);
  // Where CUDA tensors sent to `peer` go: this worker's device map toward it or, for replies
  // (and requests without a map of their own), the inverse of the peer's map toward this one.
  std::vector<std::pair<int, int>> device_map_to(int peer, bool reply);  // a DeviceMap
  // Sends the outcome of `result` (done) as the response to request `id`, recording it in
  // distributed autograd context `autograd_ctx` (0: none).
  void respond(const std::shared_ptr<Connection>& c, uint64_t id, Future<IValue>& result,
               uint64_t autograd_ctx = 0);
  // Attaches the recv function of an incoming message that carried autograd info to `tensors`.
  void record_recv(int from, const AutogradInfo& info, const std::vector<Tensor>& tensors);
  // RRefs in outgoing values become forks (appended to `made`); forks in incoming values
  // become RRefs.
  void fork_rrefs(IValue& v, std::vector<RRefForkData>& made);
  void materialize_rrefs(IValue& v);
  // What a response to call `id` arriving on `from` is: the answer to a pending call whose
  // request went out on `from`; a late answer, on our own connection to the callee, to a call
  // that is no longer pending (timed out); or a stray, from anyone else, dropped untouched.
  enum class ResponseFate { kExpected, kLate, kStray };
  ResponseFate response_fate(const std::shared_ptr<Connection>& from, uint64_t id);
  // Completes pending call `id` with `response` (a value or the callee's failure); its fate
  // was kExpected.
  void complete(const Connection& from, uint64_t id, Response& response);
  void arm_timer();
  void expire_due();
  // Fails the calls whose request went out on `conn`, which was lost.
  void fail_pending_on(const Connection* conn, const std::string& why);
  void stop(const std::string& why);
  void barrier(const std::string& phase);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<RRefContext> rrefs_;
  std::shared_ptr<AutogradHook> autograd_;
  RpcBackendOptions options_;
  WorkerInfo self_;
  std::vector<WorkerInfo> workers_;
  std::unordered_map<std::string, int> ids_;
  std::atomic<int64_t> rpc_timeout_ms_;
  std::atomic<bool> running_{false};
};

}  // namespace gw::rpc
