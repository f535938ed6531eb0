// The distributed backward pass, one Pass per worker and pass: FAST mode ("FAST mode algorithm"
// in pytorch.org/docs/stable/rpc/distributed_autograd.html), the default, and SMART mode
// (pytorch/pytorch#23110's proposal), which also runs passes where some RPC of the context is
// not on the backward path.
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
// the connection to the sender is lost first). An error anywhere answers upwards at once and fails
// the pass on every worker it reaches. The answers also carry, per worker, how many nodes still
// hold gradients while waiting for more: FAST mode's limitation (an RPC result the loss does not
// use leaves its send function without a gradient forever) then raises instead of silently
// losing those gradients or hanging as PyTorch does.
//
// SMART mode waits only for the send functions on the backward path of this pass: the live
// ones. Which are live is discovered while the pass runs, not in a phase before it:
//  - Every node knows which of its worker's candidates (the graph root, the send functions)
//    reach it (SmartTask's reach, smart_task.h). A worker counts only what live candidates reach,
//    and holds a node whose gradients are all in while an undecided candidate also reaches it.
//  - A gradient message makes its send function live. So does an AutogradDiscover: when a live
//    candidate first reaches a recv function whose gradients are not certain to flow (another
//    candidate reaching it has not had its gradients yet, so it may be held), the worker tells
//    the recv's sender at once that the matching send function is live, one message per worker.
//    A recv reached only from candidates that have their gradients will run, and its gradient
//    message says the same.
//  - So when the root's engagement completes, every live send function is known as live: the
//    rest are dead. If some worker reported nodes still open, the root engages those workers
//    again with AutogradDiscover{closed}: they release their held nodes, which then run with
//    exactly the gradients of the live paths, and the pass ends as FAST mode's does.
// When no recv function is reached from two candidates and nothing waits for an unused RPC (as
// in the parameter server), SMART mode sends exactly FAST mode's messages and costs one
// traversal per candidate more. A recv reached from two (x received, then sent on: y = rpc(w2, g,
// x)) costs a discovery message per worker upstream of it, answered within the first wave; a node
// reached from more than four candidates is held until all of its worker's candidates are
// decided, so it may wait for the second wave. Example, on worker0:
//   d = rpc_sync("worker1", add, a, b); e = rpc_sync("worker1", mul, b, c); loss = d.sum()
// FAST mode waits forever for e's gradient at b (gradwire raises); SMART mode holds b until
// the root's engagement ends, closes, and b gets d's gradient alone.
#pragma once

#include <cstdint>
#include <functional>
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
#include "rpc/protocol.h"

namespace gw::rpc {
class Agent;
}

namespace gw::dist::autograd {

class Pass : public std::enable_shared_from_this<Pass> {
 public:
  // Counts dependencies from `graph_root` (the root worker's GraphRoot; null elsewhere) and
  // the context's send functions `sends`.
  Pass(rpc::Agent& agent, const std::shared_ptr<DistAutogradContext>& ctx, uint64_t pass_id,
       bool retain_graph, bool smart, std::shared_ptr<gw::autograd::Node> graph_root,
       std::vector<std::shared_ptr<gw::autograd::Node>> sends);

  uint64_t id() const { return id_; }
  // Between a first message (or backward) and the answer to its engaging message; on the
  // root, until the pass is over (between SMART mode's two waves too).
  bool busy() const;

  // The root: runs the pass; the future completes when every worker is done, or fails.
  Future<void> run_root();
  // A gradient message from worker `from` for send function `message_id`; `returned` when
  // `from` sent it back to this worker, which engaged it, without waiting for the answer.
  Future<rpc::IValue> receive(int from, uint64_t message_id, std::vector<Tensor> grads,
                              bool returned);
  // SMART mode: an AutogradDiscover from worker `from`.
  Future<rpc::IValue> discover(int from, const std::vector<uint64_t>& message_ids, bool closed);
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
    int64_t open = 0;
  };
  using Discoveries = std::map<int, std::vector<uint64_t>>;  // message ids by worker

  // A message from `from`: `apply` hands it to the task under mu_; then engagement as above.
  Future<rpc::IValue> arrive(int from, bool returned, const std::function<void()>& apply);
  // Runs ready nodes until none is left, then answers the engaging message if it can.
  void drain();
  // SMART mode: the uncertain recv functions' send functions, counted as outstanding.
  Discoveries take_discoveries_locked();
  void send_discoveries(const Discoveries& found, bool closed);
  // The root, SMART mode: the second wave, to the workers with open nodes, if any.
  Future<rpc::IValue> close_wave(const rpc::IValue& answer);
  // The root: raises what the final reports say went wrong.
  void check(const rpc::IValue& answer) const;
  // A request whose failure to leave is its answer; tracked: answered through on_answer.
  Future<rpc::IValue> request(int to, rpc::Request r);
  void track(int to, Future<rpc::IValue> answer);
  std::shared_ptr<DistAutogradContext> context() const;  // throws once released
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
  const bool smart_;
  std::unique_ptr<gw::autograd::GraphTask> task_;  // a SmartTask in SMART mode

  mutable std::mutex mu_;
  bool draining_ = false;
  bool rooting_ = false;  // the root, from run_root until the pass is over (both waves)
  int outstanding_ = 0;   // gradient and discovery messages sent, not yet answered
  std::optional<Future<rpc::IValue>> engaged_;  // the engaging message's answer
  int engaged_by_ = -1;                         // ... and its sender
  int64_t returned_sent_ = 0;  // to engaged_by_ since the engagement began, not waited for
  std::map<int, int64_t> returned_expected_;  // by sender: announced in its answers
  std::map<int, int64_t> returned_received_;  // by sender: arrived
  std::set<int> lost_;                        // workers whose connection dropped
  std::exception_ptr error_;
  std::map<int, Report> reports_;  // by worker id; the latest report of each
  uint64_t report_seq_ = 0;
  std::set<uint64_t> received_;  // send functions that got their gradients in this pass
};

}  // namespace gw::dist::autograd
