// The FAST mode backward pass (spec: "FAST mode algorithm"), one Pass per worker and pass.
//
// The worker that calls backward(context_id, roots) counts dependencies from its roots plus
// every send function of the context, each send function expecting one gradient, and runs its
// local engine. Executing a recv function ships its gradients, with the context and message ids,
// to the worker that sent the tensors; there the first gradient of the pass makes a Pass that
// counts dependencies from all of that worker's send functions, and each gradient is handed to
// its send function. Leaf gradients go to the context, not `.grad`.
//
// Knowing when the pass is over is distributed termination detection (Dijkstra-Scholten): the
// message that finds a worker idle engages it and is answered only when that worker is idle
// again with every gradient message it sent answered; any other message is answered at once.
// The root is engaged by backward() itself, which therefore completes exactly when no worker
// has work left or gradients in flight. One shortcut saves a round trip on the common path:
// gradients a worker sends back to the worker that engaged it are not waited for; the answer
// says how many there were, and that worker counts them in before it can finish (or fails if
// the connection to the sender is lost first). An error anywhere answers upwards at once and fails the
// pass on every worker it reaches. The answers also carry, per worker, how many nodes still
// hold gradients while waiting for more: FAST mode's limitation (an RPC result the loss does not
// use leaves its send function without a gradient forever) then raises instead of silently
// losing those gradients or hanging as PyTorch does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/future.h"
#include "dist/autograd/context.h"
#include "rpc/ivalue.h"

namespace gw::rpc {
class Agent;
}

namespace gw::dist_autograd {

class Pass : public std::enable_shared_from_this<Pass> {
 public:
  // Counts dependencies from `graph_root` (the root worker's GraphRoot; null elsewhere) and
  // the context's send functions `sends`.
  Pass(rpc::Agent& agent, const std::shared_ptr<DistAutogradContext>& ctx, uint64_t pass_id,
       bool retain_graph, std::shared_ptr<autograd::Node> graph_root,
       std::vector<std::shared_ptr<autograd::Node>> sends);

  uint64_t id() const { return id_; }
  // Between a first message (or backward) and the answer to its engaging message.
  bool busy() const;

  // The root: runs the pass; the future completes when every worker is done, or fails.
  Future<void> run_root();
  // A gradient message from worker `from` for send function `message_id`; `returned` when
  // `from` sent it back to this worker, which engaged it, without waiting for the answer.
  Future<rpc::IValue> receive(int from, uint64_t message_id, std::vector<Tensor> grads,
                              bool returned);
  // Called by RecvRpcBackward on the thread running this pass.
  void send_gradients(int to, uint64_t context_id, uint64_t message_id,
                      const std::vector<Tensor>& grads);

  // The connection to `worker` was lost: fails the pass if gradients from it are still due.
  void peer_lost(int worker, const std::string& why);

  // The pass running on this thread, if any.
  static Pass* current();

 private:
  struct Report {
    uint64_t seq = 0;
    int64_t stalled = 0;
    std::string example;
  };

  // Runs ready nodes until none is left, then answers the engaging message if it can.
  void drain();
  void on_answer(int from, Future<rpc::IValue>& answer);
  bool returned_all_locked() const;
  struct Finished;
  // Takes the engaging message's answer if this worker is done (caller holds mu_).
  std::optional<Finished> take_finished_locked();
  rpc::IValue reports_value_locked() const;
  void merge_reports_locked(const rpc::IValue& v);

  rpc::Agent& agent_;
  std::weak_ptr<DistAutogradContext> ctx_;
  const uint64_t context_id_;
  const uint64_t id_;
  const bool retain_graph_;
  std::unique_ptr<autograd::GraphTask> task_;

  mutable std::mutex mu_;
  bool draining_ = false;
  int outstanding_ = 0;                          // gradient messages sent, not yet answered
  std::optional<Future<rpc::IValue>> engaged_;  // the engaging message's answer
  int engaged_by_ = -1;                              // ... and its sender
  int64_t returned_sent_ = 0;  // to engaged_by_ since the engagement began, not waited for
  std::map<int, int64_t> returned_expected_;  // by sender: announced in its answers
  std::map<int, int64_t> returned_received_;  // by sender: arrived
  std::set<int> lost_;                        // workers whose connection dropped
  std::exception_ptr error_;
  std::map<int, Report> reports_;  // by worker id; the latest report of each
  uint64_t report_seq_ = 0;
  std::set<uint64_t> received_;  // send functions that got their gradients in this pass
};

}  // namespace gw::dist_autograd
