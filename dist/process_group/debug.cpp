#include "dist/process_group/debug.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "core/trace.h"

#include "dist/debug/flight_recorder.h"

namespace gw::dist {

DebugLevel distributed_debug_level() {
  const char* v = std::getenv("GW_DISTRIBUTED_DEBUG");
  const std::string_view level = v == nullptr ? "" : v;
  if (level.empty() || level == "OFF") return DebugLevel::kOff;
  if (level == "INFO") return DebugLevel::kInfo;
  if (level == "DETAIL") return DebugLevel::kDetail;
  throw InvalidArgumentError(gw::detail::str(
      "[init_process_group] GW_DISTRIBUTED_DEBUG must be OFF, INFO or DETAIL, got '", level, "'"));
}

namespace {
// "[4096] float32"
std::string describe(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] " + std::string(dtype_name(t.dtype()));
}
}  // namespace

CollectiveSignature CollectiveSignature::of(std::string op, const std::vector<Tensor>& tensors,
                                            const std::string& extra) {
  std::string detail;
  if (!tensors.empty()) {
    bool same = true;
    for (const auto& t : tensors)
      same = same && t.sizes() == tensors[0].sizes() && t.dtype() == tensors[0].dtype();
    if (same) {
      if (tensors.size() > 1) detail = std::to_string(tensors.size()) + " x ";
      detail += describe(tensors[0]);
    } else {
      for (size_t i = 0; i < tensors.size(); ++i) detail += (i ? ", " : "") + describe(tensors[i]);
    }
  }
  if (!extra.empty()) detail += (detail.empty() ? "" : " ") + extra;
  return {std::move(op), std::move(detail)};
}

namespace signature {
namespace {
std::string root_text(int root) { return "root " + std::to_string(root); }
std::string reduce_text(ReduceOp op) { return op == ReduceOp::SUM ? "" : to_string(op); }
}  // namespace

CollectiveSignature allreduce(const Tensor& tensor, const AllreduceOptions& o) {
  return CollectiveSignature::of("allreduce", {tensor}, reduce_text(o.op));
}
CollectiveSignature allreduce_coalesced(const std::vector<Tensor>& tensors,
                                        const AllreduceOptions& o) {
  return CollectiveSignature::of("allreduce_coalesced", tensors, reduce_text(o.op));
}
CollectiveSignature broadcast(const Tensor& tensor, const BroadcastOptions& o) {
  return CollectiveSignature::of("broadcast", {tensor}, root_text(o.root));
}
CollectiveSignature reduce(const Tensor& tensor, const ReduceOptions& o) {
  std::string extra = root_text(o.root);
  if (const std::string op = reduce_text(o.op); !op.empty()) extra += " " + op;
  return CollectiveSignature::of("reduce", {tensor}, extra);
}
CollectiveSignature allgather(const Tensor& input) {
  return CollectiveSignature::of("allgather", {input});
}
CollectiveSignature gather(const Tensor& input, const GatherOptions& o) {
  return CollectiveSignature::of("gather", {input}, root_text(o.root));
}
CollectiveSignature scatter(const Tensor& output, const ScatterOptions& o) {
  return CollectiveSignature::of("scatter", {output}, root_text(o.root));
}
CollectiveSignature reduce_scatter(const Tensor& output, const CollectiveOptions& o) {
  return CollectiveSignature::of("reduce_scatter", {output}, reduce_text(o.op));
}
CollectiveSignature alltoall(const std::vector<Tensor>& inputs) {
  return CollectiveSignature::of("alltoall", inputs);
}
CollectiveSignature barrier() { return {"barrier", ""}; }
CollectiveSignature p2p(const char* op, const Tensor& tensor, int peer, int tag) {
  return CollectiveSignature::of(op, {tensor},
                                 gw::detail::str(std::string_view(op) == "send" ? "to" : "from",
                                                 " rank ", peer, " tag ", tag));
}
}  // namespace signature

namespace {

// A flow's id: the same on every rank for collective `seq` of `group` and peer rank `peer`.
uint64_t flow_id(const std::string& group, int64_t seq, int peer) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  for (char c : group) mix(static_cast<unsigned char>(c));
  mix(static_cast<uint64_t>(seq));
  mix(static_cast<uint64_t>(peer));
  return (h >> 2) | (uint64_t{1} << 62);  // apart from the RPC flows' ids
}

// Collective `seq` ended: its span runs from when it could start (queued behind the group's
// previous one) to `end`.
void trace_collective(const std::string& group, int rank, int size, int64_t seq,
                      const std::string& name, int64_t scheduled, int64_t end) {
  static std::mutex mu;
  static std::map<std::string, int64_t>* last_end = new std::map<std::string, int64_t>;
  int64_t start;
  {
    std::lock_guard lock(mu);
    int64_t& last = (*last_end)[group];
    start = std::max(scheduled, last);
    last = std::max(last, end);
  }
  const int tid = trace::track("collectives: " + group);
  trace::complete("collective", name, start, std::max(end, start + 1), tid,
                  gw::detail::str("{\"group\":\"", group, "\",\"seq\":", seq, "}"));
  if (seq < 0) return;
  if (rank == 0)
    for (int peer = 1; peer < size; ++peer)
      trace::flow(true, flow_id(group, seq, peer), start, tid);
  else
    trace::flow(false, flow_id(group, seq, rank), start, tid);
}

}  // namespace

uint64_t record_collective(const std::string& group, int rank, int size, int64_t seq,
                           const CollectiveSignature& sig, const WorkPtr& work) {
  const uint64_t id = debug::record({.kind = debug::Kind::kCollective,
                                     .state = debug::State::kScheduled,
                                     .group = group,
                                     .seq = seq,
                                     .op = sig.op,
                                     .detail = sig.detail});
  const int64_t scheduled = trace::enabled() ? trace::now_us() : 0;
  work->future().add_done_callback([=, op = sig.op, name = sig.str()](Future<void>& f) {
    debug::finish(id, f.exception());
    if (trace::enabled())
      trace_collective(group, rank, size, seq,
                       seq >= 0 ? op + " #" + std::to_string(seq) + name.substr(op.size()) : name,
                       scheduled, trace::now_us());
    if (f.has_error()) debug::request_dump(op + " #" + std::to_string(seq) + " failed on " + group);
  });
  return id;
}

DebugProcessGroup::DebugProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                     std::shared_ptr<Store> store, Milliseconds timeout)
    : ProcessGroup(inner->rank(), inner->size(), store),
      inner_(std::move(inner)),
      store_(std::move(store)),
      timeout_(timeout) {}

void DebugProcessGroup::check(const CollectiveSignature& sig, Milliseconds timeout) {
  const Milliseconds limit = timeout.count() > 0 ? timeout : timeout_;
  const int64_t seq = ++seq_;
  const std::string round = "detail/" + std::to_string(seq) + "/";
  auto key = [&](int r) { return round + std::to_string(r); };
  const std::string mine = sig.str();
  store_->set(key(rank()), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(key(r));
  const std::string where = gw::detail::str("[", sig.op, "] GW_DISTRIBUTED_DEBUG=DETAIL: ");
  try {
    store_->wait(keys, limit);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size(); ++r)
      if (!store_->check({key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (missing.empty()) throw;
    throw TimeoutError(gw::detail::str(where, "rank(s) ", missing, " did not reach collective #",
                                       seq, " within ", limit.count(), " ms; rank ", rank(),
                                       " is in ", mine));
  }
  std::vector<std::string> all;
  for (int r = 0; r < size(); ++r) all.push_back(r == rank() ? mine : store_->get_string(key(r)));
  // Every rank compares the same strings in the same order, so every rank raises alike.
  for (int r = 1; r < size(); ++r) {
    if (all[r] == all[0]) continue;
    // Not before every rank has read the signatures: the rank hosting the store may exit on
    // this error, and the others would see a lost store instead of it.
    std::vector<std::string> read;
    for (int q = 0; q < size(); ++q) read.push_back(round + "read/" + std::to_string(q));
    store_->set(read[rank()], "1");
    try {
      store_->wait(read, limit);
    } catch (const std::exception&) {  // raise what was found anyway
    }
    throw InvalidArgumentError(gw::detail::str(where, "collective #", seq,
                                               " differs across ranks: rank 0 calls ", all[0],
                                               " but rank ", r, " calls ", all[r]));
  }
  // Every rank has published this round, so every one has read the last.
  if (seq > 1)
    store_->delete_key("detail/" + std::to_string(seq - 1) + "/" + std::to_string(rank()));
}

WorkPtr DebugProcessGroup::allreduce(Tensor& tensor, AllreduceOptions o) {
  check(signature::allreduce(tensor, o), o.timeout);
  return inner_->allreduce(tensor, o);
}

WorkPtr DebugProcessGroup::allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions o) {
  check(signature::allreduce_coalesced(tensors, o), o.timeout);
  return inner_->allreduce_coalesced(tensors, o);
}

WorkPtr DebugProcessGroup::broadcast(Tensor& tensor, BroadcastOptions o) {
  check(signature::broadcast(tensor, o), o.timeout);
  return inner_->broadcast(tensor, o);
}

WorkPtr DebugProcessGroup::reduce(Tensor& tensor, ReduceOptions o) {
  check(signature::reduce(tensor, o), o.timeout);
  return inner_->reduce(tensor, o);
}

WorkPtr DebugProcessGroup::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                     CollectiveOptions o) {
  check(signature::allgather(input), o.timeout);
  return inner_->allgather(outputs, input, o);
}

WorkPtr DebugProcessGroup::gather(std::vector<Tensor>& outputs, const Tensor& input,
                                  GatherOptions o) {
  check(signature::gather(input, o), o.timeout);
  return inner_->gather(outputs, input, o);
}

WorkPtr DebugProcessGroup::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                   ScatterOptions o) {
  check(signature::scatter(output, o), o.timeout);
  return inner_->scatter(output, inputs, o);
}

WorkPtr DebugProcessGroup::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                          CollectiveOptions o) {
  check(signature::reduce_scatter(output, o), o.timeout);
  return inner_->reduce_scatter(output, inputs, o);
}

WorkPtr DebugProcessGroup::alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    CollectiveOptions o) {
  check(signature::alltoall(inputs), o.timeout);
  return inner_->alltoall(outputs, inputs, o);
}

WorkPtr DebugProcessGroup::barrier(CollectiveOptions o) {
  check(signature::barrier(), o.timeout);
  return inner_->barrier(o);
}

WorkPtr DebugProcessGroup::send(const Tensor& tensor, int dst, int tag, CollectiveOptions o) {
  return inner_->send(tensor, dst, tag, o);
}

WorkPtr DebugProcessGroup::recv(Tensor& tensor, int src, int tag, CollectiveOptions o) {
  return inner_->recv(tensor, src, tag, o);
}

}  // namespace gw::dist
