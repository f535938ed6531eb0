#include "dist/process_group/debug_process_group.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include "core/trace.h"

#include "debug/flight_recorder.h"

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
// "[4096] float32": made for every collective, so in one buffer; a tensor of one dimension
// usually fits the string's own 15 characters (no allocation).
std::string describe(const Tensor& t) {
  std::string s;
  if (t.dim() > 1) s.reserve(16 + 8 * static_cast<size_t>(t.dim()));
  s += '[';
  char digits[24];
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d) s += ", ";
    s.append(digits, std::to_chars(digits, digits + sizeof digits, t.size(d)).ptr);
  }
  s += "] ";
  s += dtype_name(t.dtype());
  return s;
}
}  // namespace

CollectiveSignature CollectiveSignature::of(std::string op, std::span<const Tensor> tensors,
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
      for (size_t i = 0; i < tensors.size(); ++i) {  // a DDP bucket's gradients: appended
        if (i) detail += ", ";
        detail += describe(tensors[i]);
      }
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
  return CollectiveSignature::of("allreduce", tensor, reduce_text(o.op));
}
CollectiveSignature allreduce_coalesced(const std::vector<Tensor>& tensors,
                                        const AllreduceOptions& o) {
  return CollectiveSignature::of("allreduce_coalesced", tensors, reduce_text(o.op));
}
CollectiveSignature broadcast(const Tensor& tensor, const BroadcastOptions& o) {
  return CollectiveSignature::of("broadcast", tensor, root_text(o.root));
}
CollectiveSignature reduce(const Tensor& tensor, const ReduceOptions& o) {
  std::string extra = root_text(o.root);
  if (const std::string op = reduce_text(o.op); !op.empty()) extra += " " + op;
  return CollectiveSignature::of("reduce", tensor, extra);
}
CollectiveSignature allgather(const Tensor& input) {
  return CollectiveSignature::of("allgather", input);
}
CollectiveSignature gather(const Tensor& input, const GatherOptions& o) {
  return CollectiveSignature::of("gather", input, root_text(o.root));
}
CollectiveSignature scatter(const Tensor& output, const ScatterOptions& o) {
  return CollectiveSignature::of("scatter", output, root_text(o.root));
}
CollectiveSignature reduce_scatter(const Tensor& output, const CollectiveOptions& o) {
  return CollectiveSignature::of("reduce_scatter", output, reduce_text(o.op));
}
CollectiveSignature all_gather_into_tensor(const Tensor& input) {
  return CollectiveSignature::of("all_gather_into_tensor", input);
}
CollectiveSignature reduce_scatter_tensor(const Tensor& output, const CollectiveOptions& o) {
  return CollectiveSignature::of("reduce_scatter_tensor", output, reduce_text(o.op));
}
CollectiveSignature alltoall(const std::vector<Tensor>& inputs) {
  return CollectiveSignature::of("alltoall", inputs);
}
CollectiveSignature barrier() { return {"barrier", ""}; }
CollectiveSignature p2p(const char* op, const Tensor& tensor, int peer, int tag) {
  return CollectiveSignature::of(op, tensor,
                                 gw::detail::str(std::string_view(op) == "send" ? "to" : "from",
                                                 " rank ", peer, " tag ", tag));
}
}  // namespace signature

namespace {

// Collective `seq` ended: its span runs from when it could start (queued behind this rank's
// previous one in the group) to `end`; send/recv (seq -1) run beside them, on a track of their
// own. An arrow runs from rank 0's span to every other rank's: it starts just inside rank 0's
// and ends just inside the end of the other's, which cannot end before rank 0 joined.
void trace_collective(const std::string& group, int rank, int size, int64_t seq,
                      const std::string& name, int64_t scheduled, int64_t end) {
  if (seq < 0) {
    trace::complete("collective", name, scheduled, std::max(end, scheduled + 2),
                    trace::track("send/recv: " + group));
    return;
  }
  static auto* mu = new std::mutex;  // both used by threads up to exit: never destroyed
  static auto* last_end = new std::map<std::pair<std::string, int>, int64_t>;
  int64_t start;
  {
    std::lock_guard lock(*mu);
    int64_t& last = (*last_end)[{group, rank}];
    start = std::max(scheduled, last + 1);  // not on the previous span's end
    end = std::max(end, start + 2);
    last = end;
  }
  const int tid = trace::track("collectives: " + group);
  trace::complete("collective", name, start, end, tid,
                  gw::detail::str("{\"group\":", trace::json_string(group), ",\"seq\":", seq, "}"));
  if (rank == 0)
    for (int peer = 1; peer < size; ++peer)
      trace::flow(true, trace::collective_flow(group, seq, peer), start + 1, tid);
  else
    trace::flow(false, trace::collective_flow(group, seq, rank), end - 1, tid);
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
  work->set_record(id, seq, group);
  // The timeline's span, only for a timeline: this runs for every collective.
  if (!trace::enabled()) return id;
  work->set_on_finish([=, scheduled = trace::now_us(), op = sig.op,
                       name = sig.str()](const std::exception_ptr&) {
    if (trace::enabled())
      trace_collective(group, rank, size, seq,
                       seq >= 0 ? op + " #" + std::to_string(seq) + name.substr(op.size()) : name,
                       scheduled, trace::now_us());
  });
  return id;
}

namespace detail {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

StoreRound store_round(store::Store& store, const std::string& round, int rank, int size,
                       const std::string& mine, Milliseconds timeout) {
  auto key = [&](int r) { return round + std::to_string(r); };
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(r));
  store.set(key(rank), mine);
  std::string verdict = "ok";
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!store.check({key(r)})) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    if (!missing.empty()) verdict = "missing:" + missing;  // else: all came, late
  }
  const store::Bytes mine_verdict(verdict.begin(), verdict.end());
  const store::Bytes decided = store.compare_set(round + "verdict", {}, mine_verdict);
  StoreRound result;
  const std::string text(decided.begin(), decided.end());
  if (text.starts_with("missing:")) {
    std::stringstream list(text.substr(8));
    for (std::string r; std::getline(list, r, ',');) result.missing.push_back(std::stoi(r));
    // Not before every rank that came has read the verdict too: the rank hosting the store may
    // exit on this error, and the others would see a lost store instead of it. Bounded by
    // `timeout` (a rank may have come and gone since).
    auto came = [&](int r) {
      return std::find(result.missing.begin(), result.missing.end(), r) == result.missing.end();
    };
    std::vector<std::string> read;
    for (int r = 0; r < size; ++r)
      if (came(r)) read.push_back(round + "read/" + std::to_string(r));
    if (came(rank)) {
      store.set(round + "read/" + std::to_string(rank), std::string("1"));
      try {
        store.wait(read, timeout);
      } catch (const TimeoutError&) {
      }
    }
    return result;
  }
  for (int r = 0; r < size; ++r)
    result.values.push_back(r == rank ? mine : store.get_string(key(r)));
  return result;
}

void delete_round(store::Store& store, const std::string& round, int rank) {
  store.delete_key(round + std::to_string(rank));
  if (rank == 0) store.delete_key(round + "verdict");
}

}  // namespace detail

DebugProcessGroup::DebugProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                     std::shared_ptr<store::Store> store, Milliseconds timeout)
    : ProcessGroup(inner->rank(), inner->size(), store),
      inner_(std::move(inner)),
      store_(std::move(store)),
      timeout_(timeout) {}

void DebugProcessGroup::check(const CollectiveSignature& sig, Milliseconds timeout) {
  const Milliseconds limit = timeout.count() > 0 ? timeout : timeout_;
  const int64_t seq = ++seq_;
  const std::string round = "detail/" + std::to_string(seq) + "/";
  const std::string mine = sig.str();
  const std::string where = gw::detail::str("[", sig.op, "] GW_DISTRIBUTED_DEBUG=DETAIL: ");
  const detail::StoreRound got = detail::store_round(*store_, round, rank(), size(), mine, limit);
  GW_CHECK(got.missing.empty(), TimeoutError, where, detail::ranks_text(got.missing),
           " did not reach collective #", seq, " within ", limit.count(), " ms; rank ", rank(),
           " is in ", mine);
  if (seq > 1) detail::delete_round(*store_, "detail/" + std::to_string(seq - 1) + "/", rank());
  // Every rank compares the same strings in the same order, so every rank raises alike.
  for (int r = 1; r < size(); ++r) {
    if (got.values[r] == got.values[0]) continue;
    // Not before every rank has read the signatures: the rank hosting the store may exit on
    // this error, and the others would see a lost store instead of it.
    detail::store_round(*store_, round + "read/", rank(), size(), "", limit);
    throw InvalidArgumentError(
        gw::detail::str(where, "collective #", seq, " differs across ranks: rank 0 calls ",
                        got.values[0], " but rank ", r, " calls ", got.values[r]));
  }
}

WorkPtr DebugProcessGroup::allreduce(Tensor& tensor, AllreduceOptions o) {
  std::lock_guard lock(mu_);
  check(signature::allreduce(tensor, o), o.timeout);
  return inner_->allreduce(tensor, o);
}

WorkPtr DebugProcessGroup::allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions o) {
  std::lock_guard lock(mu_);
  check(signature::allreduce_coalesced(tensors, o), o.timeout);
  return inner_->allreduce_coalesced(tensors, o);
}

WorkPtr DebugProcessGroup::broadcast(Tensor& tensor, BroadcastOptions o) {
  std::lock_guard lock(mu_);
  check(signature::broadcast(tensor, o), o.timeout);
  return inner_->broadcast(tensor, o);
}

WorkPtr DebugProcessGroup::reduce(Tensor& tensor, ReduceOptions o) {
  std::lock_guard lock(mu_);
  check(signature::reduce(tensor, o), o.timeout);
  return inner_->reduce(tensor, o);
}

WorkPtr DebugProcessGroup::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                     CollectiveOptions o) {
  std::lock_guard lock(mu_);
  check(signature::allgather(input), o.timeout);
  return inner_->allgather(outputs, input, o);
}

WorkPtr DebugProcessGroup::gather(std::vector<Tensor>& outputs, const Tensor& input,
                                  GatherOptions o) {
  std::lock_guard lock(mu_);
  check(signature::gather(input, o), o.timeout);
  return inner_->gather(outputs, input, o);
}

WorkPtr DebugProcessGroup::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                   ScatterOptions o) {
  std::lock_guard lock(mu_);
  check(signature::scatter(output, o), o.timeout);
  return inner_->scatter(output, inputs, o);
}

WorkPtr DebugProcessGroup::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                          CollectiveOptions o) {
  std::lock_guard lock(mu_);
  check(signature::reduce_scatter(output, o), o.timeout);
  return inner_->reduce_scatter(output, inputs, o);
}

WorkPtr DebugProcessGroup::all_gather_into_tensor(Tensor& output, const Tensor& input,
                                                  CollectiveOptions o) {
  std::lock_guard lock(mu_);
  check(signature::all_gather_into_tensor(input), o.timeout);
  return inner_->all_gather_into_tensor(output, input, o);
}

WorkPtr DebugProcessGroup::reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                                 CollectiveOptions o) {
  std::lock_guard lock(mu_);
  check(signature::reduce_scatter_tensor(output, o), o.timeout);
  return inner_->reduce_scatter_tensor(output, input, o);
}

WorkPtr DebugProcessGroup::alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    CollectiveOptions o) {
  std::lock_guard lock(mu_);
  check(signature::alltoall(inputs), o.timeout);
  return inner_->alltoall(outputs, inputs, o);
}

WorkPtr DebugProcessGroup::barrier(CollectiveOptions o) {
  std::lock_guard lock(mu_);
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
