// Seeing inside collectives: what each one is (its signature), its record in the flight recorder
// (debug/flight_recorder.h), and GW_DISTRIBUTED_DEBUG=DETAIL's check that every rank
// calls the same one (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL and ProcessGroupWrapper).
//
// Every backend records each collective it is given, numbered in call order per group:
//   allreduce #57 [4096] float32          (scheduled → started → completed / failed)
// With GW_DISTRIBUTED_DEBUG=DETAIL, init_process_group and new_group wrap their group in a
// DebugProcessGroup. Before each collective it publishes the collective's number and signature
// in the group's store and compares every rank's: on a difference every rank raises
//   [allreduce] GW_DISTRIBUTED_DEBUG=DETAIL: collective #57 differs across ranks: rank 0 calls
//   allreduce [4] float32 but rank 1 calls allreduce [8] float32
// instead of hanging or reducing mismatched memory, and a rank that never comes is named when
// the collective's timeout passes. It costs a few store round trips per collective: a debugging
// mode, as in PyTorch.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dist/process_group/process_group.h"
#include "store/store.h"

namespace gw::dist {

enum class DebugLevel { kOff, kInfo, kDetail };
// GW_DISTRIBUTED_DEBUG: OFF (default), INFO or DETAIL; throws InvalidArgumentError otherwise.
DebugLevel distributed_debug_level();

// What a collective is, as ranks must agree on it: "allreduce" and "[4096] float32 MAX".
struct CollectiveSignature {
  std::string op;
  std::string detail;  // shapes, dtype, and what else must match (the root, the reduce op)
  // `extra` follows the shapes: "root 0", "MAX". Several tensors of one shape: "3 x [4]".
  static CollectiveSignature of(std::string op, std::span<const Tensor> tensors,
                                const std::string& extra = "");
  // One tensor (most collectives): made for every call, so without a vector.
  static CollectiveSignature of(std::string op, const Tensor& tensor,
                                const std::string& extra = "") {
    return of(std::move(op), std::span<const Tensor>(&tensor, 1), extra);
  }
  std::string str() const { return detail.empty() ? op : op + " " + detail; }
  // send/recv: outside the collectives' numbering.
  bool is_p2p() const { return op == "send" || op == "recv"; }
};
// Each collective's signature, from its arguments: the same on every backend and in the check.
namespace signature {
CollectiveSignature allreduce(const Tensor& tensor, const AllreduceOptions& o);
CollectiveSignature allreduce_coalesced(const std::vector<Tensor>& tensors,
                                        const AllreduceOptions& o);
CollectiveSignature broadcast(const Tensor& tensor, const BroadcastOptions& o);
CollectiveSignature reduce(const Tensor& tensor, const ReduceOptions& o);
CollectiveSignature allgather(const Tensor& input);
CollectiveSignature gather(const Tensor& input, const GatherOptions& o);
CollectiveSignature scatter(const Tensor& output, const ScatterOptions& o);
CollectiveSignature reduce_scatter(const Tensor& output, const CollectiveOptions& o);
CollectiveSignature all_gather_into_tensor(const Tensor& input);
CollectiveSignature reduce_scatter_tensor(const Tensor& output, const CollectiveOptions& o);
CollectiveSignature alltoall(const std::vector<Tensor>& inputs);
CollectiveSignature barrier();
// send/recv: not compared across ranks, recorded with their peer and tag.
CollectiveSignature p2p(const char* op, const Tensor& tensor, int peer, int tag);
}  // namespace signature

// Records collective `seq` (from 1; -1 for send/recv) of `group` as scheduled, and its end as
// `work` finishes, before any waiter wakes (a failure also asks for a dump). With tracing on the
// collective becomes a span on the group's track, joined by flow arrows from rank 0's span to
// every other rank's. `rank` and `size` are this rank's in the group. Returns the recorder's
// id, for a "started" update.
uint64_t record_collective(const std::string& group, int rank, int size, int64_t seq,
                           const CollectiveSignature& sig, const WorkPtr& work);

namespace detail {
// One round of a check through a group's store (DETAIL's, monitored_barrier's): each rank
// publishes `mine` under `round` + its rank and waits up to `timeout` for the others'. The
// first rank to decide — every rank came, or these did not — decides for all (compare_set), so
// that no rank goes on while another gives up, and a late rank learns it was given up on.
// Returns every rank's value, or the ranks that were missing (once every rank that came has
// read that too, so that the store's host raising and exiting first does not cut the others
// off from the verdict). The round's keys stay: the caller deletes its own of the round before
// once every rank is past it (delete_round).
struct StoreRound {
  std::vector<std::string> values;  // by rank, when every rank came
  std::vector<int> missing;         // otherwise
};
StoreRound store_round(store::Store& store, const std::string& round, int rank, int size,
                       const std::string& mine, Milliseconds timeout);
// This rank's keys of `round`, read by every rank once all have come to a later round.
void delete_round(store::Store& store, const std::string& round, int rank);
// "rank 2" / "ranks 0, 2"
std::string ranks_text(const std::vector<int>& ranks);
}  // namespace detail

class DebugProcessGroup final : public ProcessGroup {
 public:
  // `store`: a namespace of the group's store for the check's keys; `timeout`: how long a rank
  // waits for the others' signatures when a collective sets none.
  DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<store::Store> store,
                    Milliseconds timeout);

  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  bool coalesces_in_place() const override { return inner_->coalesces_in_place(); }
  const std::shared_ptr<ProcessGroup>& inner() const { return inner_; }

  WorkPtr allreduce(Tensor& tensor, AllreduceOptions options = {}) override;
  WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions options = {}) override;
  WorkPtr broadcast(Tensor& tensor, BroadcastOptions options = {}) override;
  WorkPtr reduce(Tensor& tensor, ReduceOptions options = {}) override;
  WorkPtr allgather(std::vector<Tensor>& outputs, const Tensor& input,
                    CollectiveOptions options = {}) override;
  WorkPtr gather(std::vector<Tensor>& outputs, const Tensor& input,
                 GatherOptions options = {}) override;
  WorkPtr scatter(Tensor& output, const std::vector<Tensor>& inputs,
                  ScatterOptions options = {}) override;
  WorkPtr reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                         CollectiveOptions options = {}) override;
  WorkPtr all_gather_into_tensor(Tensor& output, const Tensor& input,
                                 CollectiveOptions options = {}) override;
  WorkPtr reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                CollectiveOptions options = {}) override;
  WorkPtr alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                   CollectiveOptions options = {}) override;
  WorkPtr barrier(CollectiveOptions options = {}) override;
  // Point-to-point transfers have no partner set to agree with: passed through unchecked.
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0, CollectiveOptions options = {}) override;
  WorkPtr recv(Tensor& tensor, int src, int tag = 0, CollectiveOptions options = {}) override;

 private:
  // Publishes `sig` as the next collective's and compares every rank's; throws on a
  // difference (InvalidArgumentError) or a rank that does not come (TimeoutError).
  void check(const CollectiveSignature& sig, Milliseconds timeout);

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<store::Store> store_;
  Milliseconds timeout_;
  // Held from a collective's check to its hand-off to the inner group: collectives issued
  // from several threads get their numbers in the order the inner group queues them.
  std::mutex mu_;
  int64_t seq_ = 0;
};

}  // namespace gw::dist
