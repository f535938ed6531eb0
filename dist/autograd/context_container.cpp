#include "dist/autograd/context_container.h"

#include <map>

#include "autograd/meta.h"
#include "core/log.h"
#include "core/ops.h"
#include "core/trace.h"
#include "dist/autograd/dist_engine.h"
#include "rpc/agent.h"
#include "rpc/api.h"
#include "rpc/rref_context.h"

namespace gw::dist::autograd {

namespace {
inline constexpr uint64_t kLocalIdMask = (uint64_t{1} << (64 - kWorkerIdBits)) - 1;
// How often a worker sends its batch of released contexts to each worker they reached.
inline constexpr std::chrono::microseconds kReleaseInterval{1000};

}  // namespace

Container::Container(rpc::Agent& agent)
    : agent_(agent),
      worker_bits_(static_cast<uint64_t>(agent.get_worker_info().id) << (64 - kWorkerIdBits)),
      releases_(std::make_unique<ReleaseBatcher>(
          [this](int worker, std::vector<uint64_t> ids) {
            return send_release(worker, std::move(ids));
          },
          kReleaseInterval)) {
  GW_CHECK(agent.get_worker_info().id < (1 << kWorkerIdBits), InvalidArgumentError,
           "[dist_autograd] worker id ", agent.get_worker_info().id, " does not fit in ",
           kWorkerIdBits, " bits");
  debug_section_ = debug::Section("dist_autograd", [this] {
    std::string ids;
    std::lock_guard lock(mu_);
    for (const auto& [id, ctx] : contexts_) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    return gw::detail::str("{\"worker\":\"", agent_.get_worker_info().name, "\",\"contexts\":[",
                           ids, "]}");
  });
}

Container& Container::of(rpc::Agent& agent) {
  auto* c = dynamic_cast<Container*>(agent.autograd_hook());
  GW_CHECK(c, StateError, "[dist_autograd] the RPC agent '", agent.get_worker_info().name,
           "' has no distributed autograd: start RPC with gw::dist::init_rpc "
           "(dist/init_rpc.h)");
  return *c;
}

Container& Container::current() { return of(rpc::current_agent()); }

uint64_t Container::next_id(std::atomic<uint64_t>& counter) const {
  uint64_t local = counter.fetch_add(1);
  GW_CHECK(local <= kLocalIdMask, StateError, "[dist_autograd] ran out of ids");
  return worker_bits_ | local;
}

std::shared_ptr<DistAutogradContext> Container::new_context() {
  auto ctx = std::make_shared<DistAutogradContext>(next_id(next_context_));
  std::lock_guard lock(mu_);
  contexts_.emplace(ctx->id(), ctx);
  return ctx;
}

std::shared_ptr<DistAutogradContext> Container::retrieve(uint64_t context_id) const {
  std::lock_guard lock(mu_);
  auto it = contexts_.find(context_id);
  GW_CHECK(it != contexts_.end(), InvalidArgumentError, "[dist_autograd] worker '",
           agent_.get_worker_info().name, "' has no context ", context_id,
           " (never created here, or already released)");
  return it->second;
}

bool Container::has_context(uint64_t context_id) const {
  std::lock_guard lock(mu_);
  return contexts_.contains(context_id);
}

size_t Container::num_contexts() const {
  std::lock_guard lock(mu_);
  return contexts_.size();
}

std::shared_ptr<DistAutogradContext> Container::get_or_create(uint64_t context_id) {
  std::lock_guard lock(mu_);
  auto& slot = contexts_[context_id];
  if (!slot) slot = std::make_shared<DistAutogradContext>(context_id);
  return slot;
}

std::shared_ptr<DistAutogradContext> Container::take(uint64_t context_id) {
  std::lock_guard lock(mu_);
  auto it = contexts_.find(context_id);
  if (it == contexts_.end()) return nullptr;
  auto ctx = std::move(it->second);
  contexts_.erase(it);
  return ctx;
}

Future<void> Container::send_release(int worker, std::vector<uint64_t> context_ids) {
  Future<rpc::IValue> sent;
  try {
    sent = agent_.request(worker, rpc::AutogradRelease{std::move(context_ids)});
  } catch (...) {
    sent = Future<rpc::IValue>::failed(std::current_exception());
  }
  return sent.then([this, worker](Future<rpc::IValue>& f) {
    try {
      f.wait();
    } catch (const std::exception& e) {
      log_error("[dist_autograd] releasing contexts on worker '",
                agent_.get_worker_info(worker).name, "' failed: ", e.what());
      throw;
    }
  });
}

Future<void> Container::release(const std::vector<uint64_t>& context_ids, int except) {
  std::map<int, std::vector<uint64_t>> by_worker;
  for (uint64_t id : context_ids)
    if (auto ctx = take(id))
      for (int w : ctx->known_workers())
        if (w != except && w != agent_.get_worker_info().id) by_worker[w].push_back(id);
  std::vector<Future<void>> released;
  for (auto& [w, ids] : by_worker) released.push_back(send_release(w, std::move(ids)));
  return collect_all(std::move(released)).then([](auto& all) {
    for (auto& f : all.value()) f.wait();  // the first failure fails the release
  });
}

void Container::release_later(uint64_t context_id) {
  if (auto ctx = take(context_id))
    for (int w : ctx->known_workers())
      if (w != agent_.get_worker_info().id) releases_->enqueue(w, context_id);
}

void Container::flush(std::chrono::milliseconds timeout) { releases_->flush(timeout); }

void Container::on_connection_lost(int worker, const std::string& why) {
  std::vector<std::shared_ptr<DistAutogradContext>> all;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, ctx] : contexts_) all.push_back(ctx);
  }
  for (const auto& ctx : all)
    if (auto pass = ctx->current_pass()) pass->peer_lost(worker, why);
}

rpc::AutogradInfo Container::record_send(uint64_t context_id, int to,
                                         const std::vector<Tensor>& tensors) {
  auto ctx = retrieve(context_id);
  ctx->add_known_worker(to);
  rpc::AutogradInfo info{context_id, 0};
  bool any = false;
  for (const Tensor& t : tensors) any = any || (t.defined() && t.requires_grad());
  if (!any) return info;
  auto send = std::make_shared<SendRpcBackward>(static_cast<uint32_t>(tensors.size()));
  send->next_edges.reserve(tensors.size());
  for (const Tensor& t : tensors)
    send->next_edges.push_back(t.defined() ? gw::autograd::gradient_edge(t) : gw::autograd::Edge{});
  info.message_id = next_id(next_message_);
  ctx->add_send_function(info.message_id, std::move(send));
  return info;
}

void Container::discard_send(const rpc::AutogradInfo& info) {
  if (info.message_id == 0) return;
  std::shared_ptr<DistAutogradContext> ctx;
  {
    std::lock_guard lock(mu_);
    auto it = contexts_.find(info.context_id);
    if (it == contexts_.end()) return;
    ctx = it->second;
  }
  ctx->remove_send_function(info.message_id);
}

void Container::record_recv(int from, const rpc::AutogradInfo& info,
                            const std::vector<Tensor>& tensors) {
  // A context made here exists until it is released here: a late message must not bring a
  // released one back (nothing would release it again).
  auto ctx = (info.context_id & ~kLocalIdMask) == worker_bits_ ? retrieve(info.context_id)
                                                               : get_or_create(info.context_id);
  ctx->add_known_worker(from);
  if (info.message_id == 0) return;
  auto recv = std::make_shared<RecvRpcBackward>(info.context_id, info.message_id, from,
                                                static_cast<uint32_t>(tensors.size()));
  for (uint32_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].requires_grad()) gw::autograd::set_history(tensors[i], recv, i);
  ctx->add_recv_function(info.message_id, std::move(recv));
}

std::shared_ptr<Pass> Container::joined_pass(uint64_t context_id, uint64_t pass_id,
                                             bool retain_graph, bool smart) {
  auto ctx = retrieve(context_id);
  return ctx->pass(pass_id, [&](DistAutogradContext::NodeList sends) {
    return std::make_shared<Pass>(agent_, ctx, pass_id, retain_graph, smart, nullptr,
                                  std::move(sends));
  });
}

Future<rpc::IValue> Container::handle(int from, rpc::AutogradGradients m) {
  return joined_pass(m.context_id, m.pass_id, m.retain_graph, m.smart)
      ->receive(from, m.message_id, std::move(m.grads), m.returned);
}

Future<rpc::IValue> Container::handle(int from, rpc::AutogradDiscover m) {
  return joined_pass(m.context_id, m.pass_id, m.retain_graph, true)
      ->discover(from, m.message_ids, m.closed);
}

Future<rpc::IValue> Container::handle(int from, rpc::AutogradRelease m) {
  return release(m.context_ids, from).then([](auto& done) {
    done.wait();
    return rpc::IValue();
  });
}

Future<rpc::IValue> Container::handle(int, rpc::AutogradBackward m) {
  const auto& h = m.rref.to_rref();
  GW_CHECK(h->is_owner(), StateError, "[RRef::backward] worker '", agent_.get_worker_info().name,
           "' does not own RRef ", h->rref_id().worker, ":", h->rref_id().local);
  // The value may still be being computed: run once it exists, without holding a thread.
  return h->owner_state()->value.then([this, m](Future<rpc::IValue>& v) {
    Tensor root = rpc::IValueTraits<Tensor>::from(v.value());
    return backward(m.context_id, {root}, m.retain_graph).then([](auto& done) {
      done.wait();
      return rpc::IValue();
    });
  });
}

Future<void> Container::backward(uint64_t context_id, std::vector<Tensor> roots,
                                 bool retain_graph) {
  return backward(context_id, std::move(roots), retain_graph, false);
}

Future<void> Container::backward(uint64_t context_id, std::vector<Tensor> roots, bool retain_graph,
                                 bool smart) {
  GW_CHECK(!roots.empty(), InvalidArgumentError, "[dist_autograd.backward] no roots given");
  std::vector<gw::autograd::Edge> edges;
  std::vector<Tensor> seeds;
  for (const Tensor& r : roots) {
    GW_CHECK(r.defined() && r.numel() == 1, InvalidArgumentError,
             "[dist_autograd.backward] roots must be scalars, got a tensor of shape ",
             r.defined() ? shape_str(r.sizes()) : "(undefined)");
    GW_CHECK(r.requires_grad(), InvalidArgumentError,
             "[dist_autograd.backward] a root does not require grad and has no grad_fn");
    edges.push_back(gw::autograd::gradient_edge(r));
    seeds.push_back(ones_like(r));
  }
  if (context_id == 0) {  // RRef::backward without a context: local autograd on the owner
    gw::autograd::ExecuteOptions options;
    options.keep_graph = retain_graph;
    gw::autograd::run_backward(edges, seeds, std::move(options));
    return Future<void>::ready();
  }
  auto ctx = retrieve(context_id);
  const uint64_t pass_id = next_id(next_pass_);
  auto pass = ctx->pass(pass_id, [&](DistAutogradContext::NodeList sends) {
    return std::make_shared<Pass>(agent_, ctx, pass_id, retain_graph, smart,
                                  gw::autograd::make_graph_root(edges, std::move(seeds)),
                                  std::move(sends));
  });
  const uint64_t record =
      debug::record({.kind = debug::Kind::kDistAutograd,
                     .group = agent_.get_worker_info().name,
                     .seq = static_cast<int64_t>(context_id),
                     .op = "backward",
                     .detail = (smart ? "SMART pass " : "pass ") + std::to_string(pass_id)});
  Future<void> done = pass->run_root();
  debug::finish_when_done(record, done);
  if (trace::enabled())  // the caller waits for it: a span on its thread
    done.add_done_callback(
        [context_id, start = trace::now_us(), tid = trace::current_thread()](Future<void>&) {
          trace::complete("autograd", "distributed backward, context " + std::to_string(context_id),
                          start, trace::now_us(), tid);
        });
  return done;
}

}  // namespace gw::dist::autograd
