// The agent: setup and rendezvous, calls and their deadlines, serving requests, shutdown.
// Connections live in agent_connections.cpp, the RRef protocol's part in agent_rrefs.cpp.
#include "rpc/agent.h"

#include <algorithm>
#include <regex>

#include "dist/store/rendezvous.h"
#include "rpc/agent_impl.h"
#include "rpc/autograd_hook.h"
#include "rpc/function_table.h"
#include "rpc/log.h"
#include "rpc/message.h"
#include "rpc/rref_context.h"

// A weak reference: null unless the program links the layer above that defines it.
#pragma weak gw_rpc_extend_agent

namespace gw::rpc {

namespace {
thread_local Agent* t_current_agent = nullptr;
// The agent whose network or pool thread this is (Agent::Use does not set it).
thread_local const Agent* t_owning_agent = nullptr;

void check_name(const std::string& name) {
  static const std::regex kValid("[A-Za-z0-9_:\\-]+");
  GW_CHECK(!name.empty() && name.size() < 128 && std::regex_match(name, kValid),
           InvalidArgumentError, "[init_rpc] worker name '", name,
           "' must be 1-127 characters of letters, digits, '_', ':' or '-'");
}

std::string key(const std::string& phase, int rank) {
  return "rpc/" + phase + "/" + std::to_string(rank);
}

// Requests that join the caller's distributed autograd context: user functions, and the RRef
// messages that create or copy values (remote, to_here). Not the protocol's bookkeeping.
bool joins_autograd_context(const Request& r) {
  return std::holds_alternative<Call>(r) || std::holds_alternative<RRefCreate>(r) ||
         std::holds_alternative<RRefFetch>(r);
}

// The code an exception travels with: its own for our errors, kRemote for anything else.
ErrorCode code_of(const std::exception& e) {
  const Error* err = dynamic_cast<const Error*>(&e);
  return err ? err->code() : ErrorCode::kRemote;
}

// The tensors of the values a request carries, in wire order.
std::vector<Tensor> tensors_of(Request& r) {
  std::vector<Tensor> out;
  for_each_value(r, [&](const IValue& v) { v.collect_tensors(out); });
  return out;
}
std::vector<Tensor> tensors_of(const IValue& v) {
  std::vector<Tensor> out;
  v.collect_tensors(out);
  return out;
}
}  // namespace

// Caller holds pending_mu. Removes call `it` and its deadline. The timer may stay armed for a
// deadline that is gone: it then fires, finds nothing due, and re-arms.
PendingCall Agent::Impl::take_pending_locked(
    std::unordered_map<uint64_t, PendingCall>::iterator it) {
  PendingCall p = std::move(it->second);
  pending.erase(it);
  if (p.deadline != deadlines.end()) deadlines.erase(p.deadline);
  return p;
}

Agent* Agent::current() { return t_current_agent; }
Agent::Use::Use(Agent& agent) : previous_(t_current_agent) { t_current_agent = &agent; }
Agent::Use::~Use() { t_current_agent = previous_; }

Agent::Agent(std::string name, int rank, int world_size, RpcBackendOptions options)
    : impl_(std::make_unique<Impl>()),
      options_(std::move(options)),
      self_{std::move(name), rank},
      rpc_timeout_ms_(options_.rpc_timeout.count()) {
  check_name(self_.name);
  GW_CHECK(world_size > 0 && rank >= 0 && rank < world_size, InvalidArgumentError,
           "[init_rpc] rank ", rank, " is outside [0, world_size=", world_size, ")");
  GW_CHECK(options_.num_worker_threads > 0, InvalidArgumentError,
           "[init_rpc] num_worker_threads must be positive, got ", options_.num_worker_threads);
  GW_CHECK(options_.rpc_timeout.count() >= 0, InvalidArgumentError,
           "[init_rpc] rpc_timeout must be >= 0 ms (0 = none), got ", options_.rpc_timeout.count());
  impl_->max_frame_bytes = options_.max_frame_bytes;
  impl_->on_message = [this](const auto& c, Message m) { on_message(c, std::move(m)); };
  impl_->on_close = [this](const auto& c, const std::string& why) { on_close(c, why); };
  impl_->store =
      options_.store ? options_.store : dist::rendezvous(options_.init_method, rank, world_size);
  rendezvous(world_size);
  impl_->maps_to.resize(workers_.size());
  impl_->maps_back.resize(workers_.size());
  for (const auto& [to, map] : options_.device_maps) {
    check_device_map(to, map);
    const int id = get_worker_info(to).id;
    for (const auto& [from, dst] : map) impl_->maps_to[id].emplace_back(from, dst);
  }
  rrefs_ = std::make_shared<RRefContext>(*this);
  if (gw_rpc_extend_agent) gw_rpc_extend_agent(*this);
  impl_->pool = std::make_unique<ThreadPool>(options_.num_worker_threads, [this] {
    t_current_agent = this;
    t_owning_agent = this;
  });
  accept_next();
  impl_->io_thread = std::thread([this] {
    t_current_agent = this;
    t_owning_agent = this;
    impl_->io.run();
  });
  running_ = true;
}

Agent::~Agent() {
  if (running_) stop("the RPC agent was destroyed without shutdown()");
  autograd_.reset();  // first: its threads and callbacks use the rest of the agent
}

// Publishes this worker's address, then learns everyone's.
void Agent::rendezvous(int world_size) {
  auto& a = impl_->acceptor;
  asio::ip::tcp::endpoint ep(asio::ip::make_address(options_.address), 0);
  a.open(ep.protocol());
  a.set_option(asio::ip::tcp::acceptor::reuse_address(true));
  a.bind(ep);
  a.listen();
  const std::string mine =
      self_.name + "\n" + options_.address + "\n" + std::to_string(a.local_endpoint().port());
  const dist::Bytes mine_bytes(mine.begin(), mine.end());
  dist::Bytes got = impl_->store->compare_set(key("worker", self_.id), {}, mine_bytes);
  GW_CHECK(got == mine_bytes, InvalidArgumentError, "[init_rpc] rank ", self_.id,
           " is already taken (by '", std::string(got.begin(), got.end()), "')");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(key("worker", r));
  impl_->store->wait(keys);
  for (int r = 0; r < world_size; ++r) {
    std::string v = impl_->store->get_string(keys[r]);
    auto nl1 = v.find('\n'), nl2 = v.rfind('\n');
    GW_CHECK(nl1 != std::string::npos && nl2 > nl1, IoError, "[init_rpc] malformed address '", v,
             "' published for rank ", r);
    WorkerInfo w{v.substr(0, nl1), r};
    GW_CHECK(!ids_.contains(w.name), InvalidArgumentError, "[init_rpc] worker name '", w.name,
             "' is used by ranks ", ids_[w.name], " and ", r);
    ids_[w.name] = r;
    workers_.push_back(w);
    impl_->endpoints.emplace_back(asio::ip::make_address(v.substr(nl1 + 1, nl2 - nl1 - 1)),
                                  static_cast<uint16_t>(std::stoi(v.substr(nl2 + 1))));
    impl_->outbound.emplace_back();
    impl_->connecting.push_back(false);
  }
}

const WorkerInfo& Agent::get_worker_info(const std::string& name) const {
  auto it = ids_.find(name);
  GW_CHECK(it != ids_.end(), InvalidArgumentError, "[rpc] unknown worker '", name, "'");
  return workers_[it->second];
}

const WorkerInfo& Agent::get_worker_info(int id) const {
  GW_CHECK(id >= 0 && id < static_cast<int>(workers_.size()), InvalidArgumentError,
           "[rpc] unknown worker id ", id, " (world size ", workers_.size(), ")");
  return workers_[id];
}

const WorkerInfo& Agent::resolve(const To& to) const {
  if (auto* n = std::get_if<std::string>(&to.worker)) return get_worker_info(*n);
  if (auto* i = std::get_if<int>(&to.worker)) return get_worker_info(*i);
  const auto& w = std::get<WorkerInfo>(to.worker);
  const WorkerInfo& known = get_worker_info(w.id);
  GW_CHECK(known == w, InvalidArgumentError, "[rpc] WorkerInfo(", w.name, ", ", w.id,
           ") does not match this group's worker ", w.id, " ('", known.name, "')");
  return known;
}

// --- calls -----------------------------------------------------------------------------------

Future<IValue> Agent::call(const To& to, const std::string& function, IValueList args,
                           Milliseconds timeout) {
  return request(to, Call{function, std::move(args)}, timeout);
}

Future<IValue> Agent::request(const To& to, Request r, Milliseconds timeout) {
  GW_CHECK(running_, StateError, "[rpc] the RPC agent '", self_.name, "' is shut down");
  const WorkerInfo& dst = resolve(to);
  if (timeout == kUseDefaultTimeout) timeout = rpc_timeout();
  GW_CHECK(timeout.count() >= 0, InvalidArgumentError, "[rpc] timeout must be >= 0 ms, got ",
           timeout.count());
  Message m;
  m.id = impl_->next_id.fetch_add(1);
  m.body = std::move(r);
  m.device_map = device_map_to(dst.id, /*reply=*/false);
  Request& req = *m.request();
  std::vector<RRefForkData> forks;  // undone if the request never leaves
  auto undo = [&] {
    for (const auto& d : forks) rrefs_->cancel_fork(d);
    if (m.autograd) autograd_->discard_send(*m.autograd);
  };
  Future<IValue> result;
  try {
    for_each_value(req, [&](IValue& v) { fork_rrefs(v, forks); });
    const uint64_t ctx = current_autograd_context();
    if (ctx && autograd_ && joins_autograd_context(req))
      m.autograd = autograd_->record_send(ctx, dst.id, tensors_of(req));
    std::lock_guard lock(impl_->pending_mu);
    // Checked under the lock stop() takes, so no call slips in after stop() drained the table.
    GW_CHECK(running_, StateError, "[rpc] the RPC agent '", self_.name, "' is shut down");
    PendingCall& p = impl_->pending[m.id];
    p.future = result;
    p.peer = dst.id;
    p.what = describe(req);
    p.timeout = timeout;
    p.deadline = impl_->deadlines.end();
    if (timeout.count() > 0) {
      auto when = std::chrono::steady_clock::now() + timeout;
      p.deadline = impl_->deadlines.emplace(when, m.id);
      if (when < impl_->armed_for) {
        impl_->armed_for = when;
        asio::post(impl_->io, [this] { arm_timer(); });
      }
    }
  } catch (...) {
    undo();
    throw;
  }
  try {
    std::shared_ptr<Connection> c = connection_to(dst.id, timeout);
    {
      std::lock_guard lock(impl_->pending_mu);
      if (auto it = impl_->pending.find(m.id); it != impl_->pending.end())
        it->second.conn = c.get();
    }
    c->send(m);
  } catch (...) {
    undo();
    std::unique_lock lock(impl_->pending_mu);
    // The connection may already have failed it (connection lost) on the network thread.
    if (auto it = impl_->pending.find(m.id); it != impl_->pending.end()) {
      impl_->take_pending_locked(it);
      lock.unlock();
      result.set_exception(std::current_exception());
      impl_->idle.notify_all();
    }
  }
  return result;
}

// Network thread: points the timer at the earliest deadline.
void Agent::arm_timer() {
  std::lock_guard lock(impl_->pending_mu);
  if (impl_->deadlines.empty()) {
    impl_->armed_for = std::chrono::steady_clock::time_point::max();
    impl_->timer.cancel();
    return;
  }
  impl_->armed_for = impl_->deadlines.begin()->first;
  impl_->timer.expires_at(impl_->armed_for);
  impl_->timer.async_wait([this](const std::error_code& ec) {
    if (!ec) expire_due();
  });
}

// Network thread: fails every call whose deadline has passed, then re-arms.
void Agent::expire_due() {
  std::vector<PendingCall> expired;
  {
    std::lock_guard lock(impl_->pending_mu);
    auto now = std::chrono::steady_clock::now();
    while (!impl_->deadlines.empty() && impl_->deadlines.begin()->first <= now)
      expired.push_back(
          impl_->take_pending_locked(impl_->pending.find(impl_->deadlines.begin()->second)));
  }
  for (auto& p : expired)
    Impl::fail<TimeoutError>(p, workers_[p.peer].name,
                             gw::detail::str("timed out after ", p.timeout.count(), " ms"));
  impl_->idle.notify_all();
  arm_timer();
}

Agent::ResponseFate Agent::response_fate(const std::shared_ptr<Connection>& from, uint64_t id) {
  {
    std::lock_guard lock(impl_->pending_mu);
    auto it = impl_->pending.find(id);
    // Only the connection the request went out on, which we opened to the callee and
    // introduced with our handshake, answers it: any other peer's guess of the id is dropped.
    if (it != impl_->pending.end()) {
      if (it->second.conn == from.get()) return ResponseFate::kExpected;
      ++impl_->stray_responses;
      return ResponseFate::kStray;
    }
  }
  // Not pending: a call that timed out (late answers come on our own connection to the callee,
  // and still carry RRef forks to release) or a guess from anyone else.
  bool ours;
  {
    std::lock_guard lock(impl_->conn_mu);
    const int peer = from->peer_id();
    ours = peer >= 0 && impl_->outbound[static_cast<size_t>(peer)] == from;
  }
  if (ours) return ResponseFate::kLate;
  ++impl_->stray_responses;
  return ResponseFate::kStray;
}

void Agent::complete(const Connection& from, uint64_t id, Response& response) {
  PendingCall p;
  {
    std::lock_guard lock(impl_->pending_mu);
    auto it = impl_->pending.find(id);
    if (it == impl_->pending.end()) return;  // timed out meanwhile
    GW_CHECK(it->second.conn == &from, InternalError,
             "[rpc] a checked response changed connection");
    p = impl_->take_pending_locked(it);
  }
  if (response.error)
    p.future.set_exception(
        remote_failure(response.error->code, response.error->worker, response.error->message));
  else
    p.future.set_result(std::move(response.value));
  impl_->idle.notify_all();
}

void Agent::set_autograd_hook(std::shared_ptr<AutogradHook> hook) {
  GW_CHECK(!running_, StateError, "[rpc] an agent's autograd hook is installed while it is made");
  autograd_ = std::move(hook);
}

uint64_t Agent::num_stray_responses() const { return impl_->stray_responses.load(); }

// --- serving ---------------------------------------------------------------------------------

void Agent::on_message(const std::shared_ptr<Connection>& c, Message m) {
  if (const auto* h = m.get<Handshake>()) {
    const int id = h->worker_id;
    GW_CHECK(h->protocol_version == kProtocolVersion, IoError, "[rpc] peer speaks protocol ",
             h->protocol_version, ", this worker ", kProtocolVersion);
    GW_CHECK(
        id >= 0 && id < static_cast<int>(workers_.size()) && workers_[id].name == h->worker_name,
        IoError, "[rpc] handshake from unknown worker '", h->worker_name, "' (id ", id, ")");
    c->set_peer_id(id);
    if (!m.device_map.empty()) {
      DeviceMap back;
      for (const auto& [from, to] : m.device_map) back.emplace_back(to, from);
      std::lock_guard lock(impl_->maps_mu);
      impl_->maps_back[id] = std::move(back);
    }
    return;
  }
  if (auto* r = m.get<Response>()) {
    const ResponseFate fate = response_fate(c, m.id);
    if (fate == ResponseFate::kStray) return;  // before it can touch RRefs or autograd state
    // A late answer's RRefs become handles that go at once, releasing the forks made for it.
    materialize_rrefs(r->value);
    if (fate == ResponseFate::kLate) return;
    if (!r->error) {  // an error response carries no tensors
      try {
        place_on_devices(m);
        if (m.autograd) record_recv(c->peer_id(), *m.autograd, tensors_of(r->value));
      } catch (const std::exception& e) {
        r->error = Failure{self_.name, e.what(), code_of(e)};
      }
    }
    complete(*c, m.id, *r);
    return;
  }
  GW_CHECK(c->peer_id() >= 0, IoError, "[rpc] request before handshake");
  Request& req = *m.request();
  for_each_value(req, [&](IValue& v) { materialize_rrefs(v); });
  try {
    place_on_devices(m);
    if (m.autograd) record_recv(c->peer_id(), *m.autograd, tensors_of(req));
  } catch (...) {
    Future<IValue> failed = Future<IValue>::failed(std::current_exception());
    respond(c, m.id, failed);
    return;
  }
  // Dispatch on the request's variant: user calls and distributed autograd's requests run on
  // the pool, the RRef protocol's on this thread.
  const uint64_t ctx = m.autograd ? m.autograd->context_id : 0;
  std::visit(
      [&](auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, Call>) {
          run_function(
              r.function, std::move(r.args), ctx,
              [this, c, id = m.id, ctx](Future<IValue>& done) { respond(c, id, done, ctx); });
        } else if constexpr (std::is_same_v<T, AutogradGradients> ||
                             std::is_same_v<T, AutogradRelease> ||
                             std::is_same_v<T, AutogradBackward>) {
          serve_autograd(c, m.id, [this, from = c->peer_id(), msg = std::move(r)]() mutable {
            return autograd_->handle(from, std::move(msg));
          });
        } else {
          handle_rref(c, m.id, ctx, req);
        }
      },
      req);
}

void Agent::serve_autograd(const std::shared_ptr<Connection>& c, uint64_t id,
                           std::function<Future<IValue>()> handle) {
  run_on_pool(
      [this, handle = std::move(handle)] {
        GW_CHECK(autograd_, InvalidArgumentError, "[rpc] worker '", self_.name,
                 "' cannot serve distributed autograd: it does not link gw_dist");
        return handle();
      },
      0, [this, c, id](Future<IValue>& done) { respond(c, id, done); });
}

void Agent::record_recv(int from, const AutogradInfo& info, const std::vector<Tensor>& tensors) {
  GW_CHECK(autograd_, InvalidArgumentError, "[rpc] worker '", self_.name,
           "' received a message recorded in distributed autograd context ", info.context_id,
           " but does not link distributed autograd (gw_dist)");
  autograd_->record_recv(from, info, tensors);
}

void Agent::run_function(const std::string& function, IValueList args, uint64_t autograd_ctx,
                         std::function<void(Future<IValue>&)> done) {
  run_on_pool([function, args = std::move(args)] { return functions().invoke(function, args); },
              autograd_ctx, std::move(done));
}

void Agent::run_on_pool(std::function<Future<IValue>()> work, uint64_t autograd_ctx,
                        std::function<void(Future<IValue>&)> done) {
  {
    std::lock_guard lock(impl_->pending_mu);
    ++impl_->active_handlers;
  }
  impl_->pool->submit([this, autograd_ctx, work = std::move(work), done = std::move(done)] {
    Future<IValue> result;
    try {
      AutogradContextScope in_context(autograd_ctx);
      result = work();
    } catch (...) {
      result = Future<IValue>::failed(std::current_exception());
    }
    // Async functions complete later, on whichever thread finishes their future.
    result.add_done_callback([this, done](Future<IValue>& r) {
      try {
        done(r);
      } catch (const std::exception& e) {
        log_error(self_.name, ": answering a request failed: ", e.what());
      }
      {
        std::lock_guard lock(impl_->pending_mu);
        --impl_->active_handlers;
      }
      impl_->idle.notify_all();
    });
  });
}

void Agent::respond(const std::shared_ptr<Connection>& c, uint64_t id, Future<IValue>& result,
                    uint64_t autograd_ctx) {
  Message r;
  r.id = id;
  r.body = Response{};
  Response& out = *r.get<Response>();
  r.device_map = device_map_to(c->peer_id(), /*reply=*/true);
  std::vector<RRefForkData> forks;  // undone if the response never leaves
  auto undo = [&] {
    for (const auto& d : forks) rrefs_->cancel_fork(d);
    forks.clear();
    if (r.autograd) autograd_->discard_send(*r.autograd);
    r.autograd.reset();
  };
  auto fail = [&](const std::string& what, ErrorCode code) {
    undo();
    out.value = IValue();
    out.error = Failure{self_.name, what, code};
  };
  try {
    out.value = result.value();
    fork_rrefs(out.value, forks);
    if (autograd_ctx && autograd_) {
      AutogradInfo info = autograd_->record_send(autograd_ctx, c->peer_id(), tensors_of(out.value));
      if (info.message_id) r.autograd = info;
    }
  } catch (const std::exception& e) {
    fail(e.what(), code_of(e));
  }
  try {
    c->send(r);
  } catch (const IoError&) {
    // The caller's connection is gone; its side has already failed the call.
    undo();
  } catch (const std::exception& e) {
    // The result cannot be sent (e.g. a CUDA tensor, an object): tell the caller why.
    fail(e.what(), code_of(e));
    try {
      c->send(r);
    } catch (const std::exception&) {
    }
  }
}

// --- shutdown --------------------------------------------------------------------------------

void Agent::barrier(const std::string& phase) {
  impl_->store->set(key(phase, self_.id), std::string("1"));
  std::vector<std::string> keys;
  for (const auto& w : workers_) keys.push_back(key(phase, w.id));
  impl_->store->wait(keys);
}

void Agent::shutdown(bool graceful) {
  if (!running_) return;
  GW_CHECK(t_owning_agent != this, StateError, "[shutdown] cannot shut down agent '", self_.name,
           "' from one of its own threads (a request handler or a future callback)");
  if (graceful) {
    if (autograd_) {
      try {
        autograd_->flush(rpc_timeout().count() > 0 ? rpc_timeout() : kDefaultRpcTimeout);
      } catch (const std::exception& e) {
        log_error(self_.name, ": distributed autograd did not finish before shutdown: ", e.what());
      }
    }
    auto wait_idle = [&](bool handlers_too) {
      std::unique_lock lock(impl_->pending_mu);
      impl_->idle.wait(lock, [&] {
        return impl_->pending.empty() && (!handlers_too || impl_->active_handlers == 0);
      });
    };
    wait_idle(false);  // our own calls are answered
    rrefs_->release_users(rpc_timeout());
    wait_idle(false);            // ... and so are the deletes of our RRefs
    barrier("shutdown-arrive");  // nobody starts new work for us now
    wait_idle(true);             // ... and what we serve for others is done
    barrier("shutdown-leave");   // everyone is done: connections may close
  }
  stop("the RPC agent was shut down");
  if (graceful) {
    // Rank 0 may own the store (TCPStore): keep it alive until everyone has left the barrier.
    impl_->store->set(key("shutdown-exit", self_.id), std::string("1"));
    if (self_.id == 0) {
      std::vector<std::string> keys;
      for (const auto& w : workers_) keys.push_back(key("shutdown-exit", w.id));
      impl_->store->wait(keys);
    }
  }
}

void Agent::stop(const std::string& why) {
  // Fail what is still pending with the reason, before closing connections would fail it
  // with "connection lost". running_ changes under the lock call() checks it under.
  std::unordered_map<uint64_t, PendingCall> left;
  {
    std::lock_guard lock(impl_->pending_mu);
    running_ = false;
    left.swap(impl_->pending);
    impl_->deadlines.clear();
  }
  for (auto& [id, p] : left) Impl::fail<StateError>(p, workers_[p.peer].name, "failed: " + why);
  asio::post(impl_->io, [this, why] {
    std::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->timer.cancel();
    std::vector<std::shared_ptr<Connection>> all;
    {
      std::lock_guard lock(impl_->conn_mu);
      all.assign(impl_->inbound.begin(), impl_->inbound.end());
      for (auto& c : impl_->outbound)
        if (c) all.push_back(c);
    }
    for (auto& c : all) c->close(why);
    impl_->work.reset();
  });
  impl_->io_thread.join();
  impl_->pool.reset();  // runs what was queued (their responses find closed connections)
  // An async function's future may complete later, on another thread, and its callback uses
  // this agent: wait for those (our failed calls above let chains on them finish) so that the
  // agent can be destroyed. Bounded, for a function waiting on something that never comes.
  {
    std::unique_lock lock(impl_->pending_mu);
    const Milliseconds bound = rpc_timeout().count() > 0 ? rpc_timeout() : kDefaultRpcTimeout;
    if (!impl_->idle.wait_for(lock, bound, [&] { return impl_->active_handlers == 0; }))
      log_error(self_.name, ": ", impl_->active_handlers,
                " request handler(s) still running after shutdown");
  }
  std::lock_guard lock(impl_->conn_mu);
  impl_->inbound.clear();
  for (auto& c : impl_->outbound) c.reset();
}

}  // namespace gw::rpc
