// How the RPC agent takes part in distributed autograd without depending on it.
//
// Distributed autograd (dist/autograd) sits above rpc. An AutogradHook is one of the agent's
// interceptors (rpc/interceptor.h): a request made inside a distributed autograd context, and
// the response to it, carry the context id and, when they hold tensors that require grad, the
// id of the send function recorded for them (record_send). The receiver attaches the matching
// recv function to the tensors it read (record_recv) and runs the request's handler with the
// context current, so nested calls join the same context. Distributed autograd's own requests
// (AutogradGradients, AutogradDiscover, AutogradRelease, AutogradBackward in rpc/protocol.h) go to
// the hook.
//
// Installation is explicit: the layer above rpc hands the agent an extension in its options
// (RpcBackendOptions::extensions; gw::dist::init_rpc, dist/init_rpc.h, passes dist's), which
// installs a hook on the agent with Agent::set_autograd_hook while the agent is constructed. An
// agent started without it refuses autograd messages with an error that says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/future.h"
#include "core/tensor.h"
#include "rpc/interceptor.h"
#include "rpc/ivalue.h"
#include "rpc/protocol.h"

namespace gw::rpc {

class Agent;

// The distributed autograd context of this thread (0: none). Context ids are globally unique.
uint64_t current_autograd_context();

// Makes `context_id` current on this thread until destroyed.
class AutogradContextScope {
 public:
  explicit AutogradContextScope(uint64_t context_id);
  ~AutogradContextScope();
  AutogradContextScope(const AutogradContextScope&) = delete;
  AutogradContextScope& operator=(const AutogradContextScope&) = delete;

 private:
  uint64_t previous_;
};

class AutogradHook : public Interceptor {
 public:
  // Interceptor, in terms of record_send, discard_send and record_recv below (autograd_hook.cpp).
  void outgoing(int to, Message& m, uint64_t autograd_context) final;
  void cancelled(Message& m) final;
  void incoming(int from, Message& m, Arrival arrival) final;

  // A message to worker `to` in context `context_id` carries `tensors` (in wire order): records
  // a send function when some require grad. Returns what the message carries.
  virtual AutogradInfo record_send(uint64_t context_id, int to,
                                   const std::vector<Tensor>& tensors) = 0;
  // The message record_send returned `info` for could not be sent: forgets its send function.
  virtual void discard_send(const AutogradInfo& info) = 0;
  // A message from worker `from` carried `info`: joins the context and attaches the recv
  // function to `tensors` (in wire order) that require grad.
  virtual void record_recv(int from, const AutogradInfo& info,
                           const std::vector<Tensor>& tensors) = 0;
  // Serve distributed autograd's requests from worker `from` (on the agent's pool).
  virtual Future<IValue> handle(int from, AutogradGradients message) = 0;
  virtual Future<IValue> handle(int from, AutogradDiscover message) = 0;
  virtual Future<IValue> handle(int from, AutogradRelease message) = 0;
  virtual Future<IValue> handle(int from, AutogradBackward message) = 0;
  // Sends what distributed autograd still owes other workers (context releases) and waits for
  // it: the agent's graceful shutdown calls this first.
  virtual void flush(std::chrono::milliseconds timeout) = 0;
  // The connection to `worker` was lost (it may have died).
  virtual void on_connection_lost(int worker, const std::string& why) = 0;
  // Runs a distributed backward pass from local `roots` (RRef::backward on the owner).
  virtual Future<void> backward(uint64_t context_id, std::vector<Tensor> roots,
                                bool retain_graph) = 0;
};

}  // namespace gw::rpc
