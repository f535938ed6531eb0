// The distributed autograd state of one worker (PyTorch's DistAutogradContainer): its contexts
// by id, and the id generators. It is the RPC agent's AutogradHook (rpc/autograd_hook.h), so
// there is one per agent, made when the agent starts.
//
// Ids are 64 bits with the worker id in the top 16, so ids made on different workers never
// collide. A context exists on every worker that sent or received a message in it; leaving it
// on the worker that made it releases it there and, through the workers each one exchanged
// messages with, everywhere else.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "debug/flight_recorder.h"

#include "dist/autograd/context.h"
#include "dist/autograd/release_batcher.h"
#include "rpc/autograd_hook.h"

namespace gw::rpc {
class Agent;
}

namespace gw::dist::autograd {

class Container final : public rpc::AutogradHook, public std::enable_shared_from_this<Container> {
 public:
  explicit Container(rpc::Agent& agent);

  // The container of `agent` / of the agent calls go through on this thread.
  static Container& of(rpc::Agent& agent);
  static Container& current();

  rpc::Agent& agent() const { return agent_; }
  std::shared_ptr<DistAutogradContext> new_context();
  // Throws InvalidArgumentError for an unknown or released id.
  std::shared_ptr<DistAutogradContext> retrieve(uint64_t context_id) const;
  bool has_context(uint64_t context_id) const;
  size_t num_contexts() const;
  // Drops the contexts here and on every worker they reached; the future completes once they
  // all have (worker `except` is skipped: it asked).
  Future<void> release(const std::vector<uint64_t>& context_ids, int except);
  // A Context going out of scope: drops it here now and tells the workers it reached in the
  // next batch (release_batcher.h).
  void release_later(uint64_t context_id);
  // Sends the queued releases and waits for every release sent so far.
  void flush(std::chrono::milliseconds timeout) override;

  rpc::AutogradInfo record_send(uint64_t context_id, int to,
                                const std::vector<Tensor>& tensors) override;
  void discard_send(const rpc::AutogradInfo& info) override;
  void record_recv(int from, const rpc::AutogradInfo& info,
                   const std::vector<Tensor>& tensors) override;
  Future<rpc::IValue> handle(int from, rpc::AutogradGradients message) override;
  Future<rpc::IValue> handle(int from, rpc::AutogradDiscover message) override;
  Future<rpc::IValue> handle(int from, rpc::AutogradRelease message) override;
  Future<rpc::IValue> handle(int from, rpc::AutogradBackward message) override;
  Future<void> backward(uint64_t context_id, std::vector<Tensor> roots,
                        bool retain_graph) override;  // FAST mode
  // `smart`: SMART mode (dist_engine.h).
  Future<void> backward(uint64_t context_id, std::vector<Tensor> roots, bool retain_graph,
                        bool smart);
  void on_connection_lost(int worker, const std::string& why) override;

 private:
  std::shared_ptr<DistAutogradContext> get_or_create(uint64_t context_id);
  // The pass a message of another worker's pass joins here.
  std::shared_ptr<Pass> joined_pass(uint64_t context_id, uint64_t pass_id, bool retain_graph,
                                    bool smart);
  std::shared_ptr<DistAutogradContext> take(uint64_t context_id);  // nullptr if absent
  Future<void> send_release(int worker, std::vector<uint64_t> context_ids);
  uint64_t next_id(std::atomic<uint64_t>& counter) const;

  rpc::Agent& agent_;
  const uint64_t worker_bits_;
  std::atomic<uint64_t> next_context_{1};
  std::atomic<uint64_t> next_message_{1};
  std::atomic<uint64_t> next_pass_{1};
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<DistAutogradContext>> contexts_;
  std::unique_ptr<ReleaseBatcher> releases_;  // its thread calls into the others
  debug::Section debug_section_;              // the live contexts, in get_debug_info()
};

}  // namespace gw::dist::autograd
