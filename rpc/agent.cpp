// The agent: setup and rendezvous, sending requests, routing what arrives, shutdown. The RRef
// protocol's part is in agent_rrefs.cpp, device maps in device_map.cpp.
#include "rpc/agent.h"

#include <algorithm>

#include "core/log.h"
#include "core/trace.h"
#include "rpc/agent_options.h"
#include "rpc/autograd_hook.h"
#include "rpc/call_table.h"
#include "rpc/dispatcher.h"
#include "rpc/function_table.h"
#include "rpc/message.h"
#include "rpc/rref_context.h"
#include "rpc/transport.h"
#include "store/rendezvous.h"

namespace gw::rpc {

namespace {
thread_local Agent* t_current_agent = nullptr;
// The agent whose network or pool thread this is (Agent::Use does not set it).
thread_local const Agent* t_owning_agent = nullptr;

// The caller's side: a span for the send on the calling thread, and one for the answer on the
// thread that completes it (with the arrow from the handler, unless `answer_flow` is off).
void trace_call(const std::string& what, const std::string& callee, int caller, uint64_t id,
                int64_t sent, bool answer_flow, Future<IValue>& result) {
  const int tid = trace::current_thread();
  trace::complete("rpc", what + " to " + callee, sent, std::max(trace::now_us(), sent + 2), tid);
  trace::flow(true, trace::rpc_flow(caller, id, false), sent + 1, tid);
  result.add_done_callback(
      [name = "answer to " + what + " from " + callee, caller, id, answer_flow](Future<IValue>&) {
        const int64_t at = trace::now_us();
        trace::complete("rpc", name, at, at + 2, trace::current_thread());
        if (answer_flow)
          trace::flow(false, trace::rpc_flow(caller, id, true), at + 1, trace::current_thread());
      });
}

// Raised by a worker whose graceful shutdown failed, for those still waiting in its barriers.
constexpr const char* kShutdownFailed = "rpc/shutdown-failed";

std::string key(const std::string& phase, int rank) {
  return "rpc/" + phase + "/" + std::to_string(rank);
}

// Requests that join the caller's distributed autograd context: user functions, and the RRef
// messages that create or copy values (remote, to_here). Not the protocol's bookkeeping.
bool joins_autograd_context(const Request& r) {
  return std::holds_alternative<Call>(r) || std::holds_alternative<RRefCreate>(r) ||
         std::holds_alternative<RRefFetch>(r);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// The time left until `deadline` (at least 1 ms), or `otherwise` when there is none.
Milliseconds until(std::chrono::steady_clock::time_point deadline, Milliseconds otherwise) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return otherwise;
  return std::max(Milliseconds(1),
                  std::chrono::ceil<Milliseconds>(deadline - std::chrono::steady_clock::now()));
}

}  // namespace

Agent* Agent::current() { return t_current_agent; }
Agent::Use::Use(Agent& agent) : previous_(t_current_agent) { t_current_agent = &agent; }
Agent::Use::~Use() { t_current_agent = previous_; }

Agent::Agent(std::string name, int rank, int world_size, RpcBackendOptions options)
    : self_{std::move(name), rank}, rpc_timeout_ms_(options.rpc_timeout.count()) {
  // Checked, and completed from the environment, before anything is made (agent_options.h).
  ResolvedOptions resolved = resolve_options(self_, world_size, std::move(options));
  options_ = std::move(resolved.options);
  // The transport listens now; its network thread starts last, once everything it calls is made.
  Transport::Handlers handlers;
  handlers.on_message = [this](const auto& c, Message m) { on_message(c, std::move(m)); };
  handlers.on_close = [this](const auto& c, const std::string& why) { on_close(c, why); };
  handlers.hello = [this](int peer) {
    Message hello;
    hello.body = Handshake{kProtocolVersion, self_.name, self_.id, {}};
    hello.device_map = maps_to_[static_cast<size_t>(peer)];
    return hello;
  };
  handlers.unsent = [this](Message& m) { cancelled(m); };
  transport_ = std::make_unique<Transport>(std::move(resolved.transport), std::move(handlers));
  // Rendezvous: the store given, else init_method's; then every worker's address through it.
  store_ = options_.store ? options_.store
                          : store::rendezvous(options_.init_method, rank, world_size,
                                              store::kDefaultStoreTimeout, resolved.store_security);
  serving_ = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(world_size));
  const std::vector<PeerAddress> peers = rendezvous(world_size);
  // Now that the group is known: the call table (by worker name), the device maps (by worker
  // id), the RRef protocol, then the extensions (distributed autograd's hook), so that every
  // interceptor is in place before the first message.
  std::vector<std::string> names;
  for (const auto& w : workers_) names.push_back(w.name);
  calls_ = std::make_unique<CallTable>(transport_->io(), std::move(names), self_.name);
  load_device_maps();
  rrefs_ = std::make_shared<RRefContext>(*this);
  for (const auto& extend : options_.extensions) extend(*this);
  interceptors_.push_back(rrefs_.get());
  if (autograd_) interceptors_.push_back(autograd_.get());
  auto mark_thread = [this] {
    t_current_agent = this;
    t_owning_agent = this;
  };
  dispatcher_ = std::make_unique<Dispatcher>(self_.name, options_.num_worker_threads, mark_thread);
  // Running before the first request can arrive: a peer done with its own constructor may call
  // at once, and the handler may call on (a nested RPC) before this constructor returns.
  running_ = true;
  debug::set_identity(self_.id, self_.name);
  trace::set_process(self_.id, self_.name);
  debug_section_ = debug::Section("rpc", [this] { return debug_json(); });
  debug::dump_on_sigusr1();
  transport_->start(peers, *calls_, mark_thread);
}

Agent::~Agent() {
  if (running_) stop("the RPC agent was destroyed without shutdown()");
  autograd_.reset();      // first: its threads and callbacks use the rest of the agent
  interceptors_.clear();  // then: those threads send through the interceptors
}

// Linear in the world size: each worker publishes its entry and bumps a counter (two requests);
// the last to arrive joins the entries into one table (n reads by one worker), and everyone
// reads that (one request each) — instead of every worker reading every entry.
std::vector<PeerAddress> Agent::rendezvous(int world_size) {
  const std::string mine =
      self_.name + "\n" + options_.address + "\n" + std::to_string(transport_->port());
  const store::Bytes mine_bytes(mine.begin(), mine.end());
  store::Bytes got = store_->compare_set(key("worker", self_.id), {}, mine_bytes);
  GW_CHECK(got == mine_bytes, InvalidArgumentError, "[init_rpc] rank ", self_.id,
           " is already taken (by '", std::string(got.begin(), got.end()), "')");
  if (store_->add("rpc/workers/arrived", 1) == world_size) {
    std::string table;
    for (int r = 0; r < world_size; ++r) table += store_->get_string(key("worker", r)) + "\n";
    store_->set("rpc/workers/table", table);
  }
  store_->wait({"rpc/workers/table"});
  const std::string table = store_->get_string("rpc/workers/table");
  std::vector<PeerAddress> peers;
  size_t at = 0;
  for (int r = 0; r < world_size; ++r) {
    // Three lines per worker: name, address, port.
    std::string line[3];
    for (auto& l : line) {
      const size_t nl = table.find('\n', at);
      GW_CHECK(nl != std::string::npos, IoError, "[init_rpc] the workers' table ends at rank ", r);
      l = table.substr(at, nl - at);
      at = nl + 1;
    }
    WorkerInfo w{line[0], r};
    GW_CHECK(!ids_.contains(w.name), InvalidArgumentError, "[init_rpc] worker name '", w.name,
             "' is used by ranks ", ids_[w.name], " and ", r);
    ids_[w.name] = r;
    workers_.push_back(w);
    peers.push_back({w.name, line[1], static_cast<uint16_t>(std::stoi(line[2]))});
  }
  return peers;
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
  const uint64_t ctx = joins_autograd_context(r) ? current_autograd_context() : 0;
  std::string what = describe(r);
  const int64_t sent = trace::enabled() ? trace::now_us() : 0;
  // Only requests the callee runs on its pool have a handler span to point at (serve()).
  const bool remote_create = std::holds_alternative<RRefCreate>(r);
  const bool on_pool =
      !std::holds_alternative<RRefFetch>(r) && !std::holds_alternative<RRefFork>(r) &&
      !std::holds_alternative<RRefAccept>(r) && !std::holds_alternative<RRefDelete>(r);
  const std::string traced = trace::enabled() && on_pool ? what : std::string();
  Message m;
  m.id = next_id_.fetch_add(1);
  const uint64_t id = m.id;
  m.body = std::move(r);
  m.device_map = device_map_to(dst.id, /*reply=*/false);
  outgoing(dst.id, m, ctx);
  Future<IValue> result;
  try {
    result = calls_->add(m.id, dst.id, std::move(what), timeout);
  } catch (...) {
    cancelled(m);
    throw;
  }
  const auto deadline = timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout
                                            : std::chrono::steady_clock::time_point::max();
  transport_->send(dst.id, std::move(m), deadline);
  if (!traced.empty())  // remote()'s answer comes before its function has run
    trace_call(traced, dst.name, self_.id, id, sent, !remote_create, result);
  return result;
}

void Agent::outgoing(int to, Message& m, uint64_t autograd_context) {
  size_t done = 0;
  try {
    for (; done < interceptors_.size(); ++done)
      interceptors_[done]->outgoing(to, m, autograd_context);
  } catch (...) {
    while (done-- > 0) interceptors_[done]->cancelled(m);
    throw;
  }
}

void Agent::cancelled(Message& m) {
  for (auto it = interceptors_.rbegin(); it != interceptors_.rend(); ++it) {
    try {
      (*it)->cancelled(m);
    } catch (const std::exception& e) {
      log_error(self_.name, ": undoing an unsent message failed: ", e.what());
    }
  }
}

void Agent::receive(int from, Message& m, Arrival arrival) {
  for (Interceptor* i : interceptors_) i->incoming(from, m, arrival);
  // After the RRef interceptor: the RRefs it made are released with the failed message.
  GW_CHECK(!m.autograd || autograd_ || arrival == Arrival::kLateResponse, InvalidArgumentError,
           "[rpc] worker '", self_.name,
           "' received a message recorded in distributed autograd context ",
           m.autograd ? m.autograd->context_id : 0,
           " but has no distributed autograd: start RPC with gw::dist::init_rpc (dist/init_rpc.h)");
}

void Agent::set_autograd_hook(std::shared_ptr<AutogradHook> hook) {
  GW_CHECK(!running_ && interceptors_.empty(), StateError,
           "[rpc] an agent's autograd hook is installed while it is made");
  autograd_ = std::move(hook);
}

uint64_t Agent::num_stray_responses() const { return stray_responses_.load(); }

std::string Agent::link(const To& to) const { return transport_->link(resolve(to).id); }

// --- receiving -------------------------------------------------------------------------------

void Agent::on_message(const std::shared_ptr<Connection>& c, Message m) {
  if (const auto* h = m.get<Handshake>()) {
    // The transport knows who this is: the worker that proved the key as it opened the
    // connection. What the Handshake adds is the protocol version and its device map.
    const int id = c->peer_id();
    GW_CHECK(h->protocol_version == kProtocolVersion, IoError, "[rpc] peer speaks protocol ",
             h->protocol_version, ", this worker ", kProtocolVersion);
    GW_CHECK(id == h->worker_id && workers_[id].name == h->worker_name, IoError,
             "[rpc] a Handshake naming worker '", h->worker_name, "' (id ", h->worker_id,
             ") on the connection of '", workers_[id].name, "'");
    if (!m.device_map.empty()) {
      DeviceMap back;
      for (const auto& [from, to] : m.device_map) back.emplace_back(to, from);
      std::lock_guard lock(maps_mu_);
      maps_back_[id] = std::move(back);
    }
    return;
  }
  if (m.get<Response>()) return on_response(c, std::move(m));
  on_request(c, std::move(m));
}

// Only the connection a request went out on, which we opened to the callee and introduced with
// our handshake, answers it. A response to a call no longer pending (it timed out) that comes
// on our own connection to the callee is a late answer: its RRefs are materialized and dropped,
// which releases the forks made for it. Anything else is a stray, dropped untouched.
void Agent::on_response(const std::shared_ptr<Connection>& c, Message m) {
  Future<IValue> claimed;
  switch (calls_->claim(m.id, c.get(), claimed)) {
    case CallTable::Match::kPending:
      break;
    case CallTable::Match::kNotPending:
      if (transport_->is_outbound(c)) {
        try {
          receive(c->peer_id(), m, Arrival::kLateResponse);
        } catch (const std::exception& e) {
          log_error(self_.name, ": releasing a late answer failed: ", e.what());
        }
        return;
      }
      [[fallthrough]];
    case CallTable::Match::kOtherConnection:
      // Logged at the 1st, 2nd, 4th, 8th, ... so that a flood cannot flood the log.
      if (const uint64_t n = ++stray_responses_; (n & (n - 1)) == 0)
        log_error(self_.name, ": dropped a response to call ", m.id, " from ", c->remote(),
                  ", which that call did not go to (", n, " dropped so far)");
      return;
  }
  Response& r = *m.get<Response>();
  try {
    receive(c->peer_id(), m, Arrival::kResponse);
  } catch (const std::exception& e) {
    set_failure(r, self_.name, e);
  }
  if (m.placements.empty() || r.error) return calls_->answer(claimed, r);
  // Copies to a GPU happen off the network thread, and not behind the requests queued for the
  // pool, whose handlers may be waiting for this very answer.
  auto held = std::make_shared<Message>(std::move(m));
  try {
    dispatcher_->run_apart([this, held, claimed]() mutable {
      Response& r = *held->get<Response>();
      try {
        place_on_devices(*held);
      } catch (const std::exception& e) {
        set_failure(r, self_.name, e);
      }
      calls_->answer(claimed, r);
    });
  } catch (const std::exception& e) {
    set_failure(*held->get<Response>(), self_.name, e);
    calls_->answer(claimed, *held->get<Response>());
  }
}

void Agent::on_close(const std::shared_ptr<Connection>& c, const std::string& why) {
  calls_->fail_on(c.get(), why);
  if (autograd_ && c->peer_id() >= 0) autograd_->on_connection_lost(c->peer_id(), why);
}

// --- shutdown --------------------------------------------------------------------------------

// Linear in the world size: a counter, and a flag the last to arrive raises. Each worker also
// leaves its own mark, read only when the barrier fails, to name those who did not come. Every
// store call is bounded by `deadline` (a store whose host went silent must not hold us), and
// the wait goes in slices so that a worker declared dead, or whose connection was lost, ends it
// early.
std::string Agent::barrier(const std::string& phase, Clock::time_point deadline) {
  const std::string at = "rpc/" + phase;
  const int n = static_cast<int>(workers_.size());
  const auto left = [&] { return until(deadline, store_->timeout()); };
  std::string failed;
  bool others_failed = false;
  try {
    store_->add_within(key(phase, self_.id), 1, left());
    if (store_->add_within(at + "/arrived", 1, left()) == n)
      store_->add_within(at + "/done", 1, left());
    const auto start = Clock::now();
    const int next = (self_.id + 1) % n;
    for (bool gone = false;;) {  // bounded by `deadline` (none: the user asked to wait for ever)
      // After a worker is gone, one last look: it may have passed the barrier and closed.
      const Milliseconds slice = gone ? Milliseconds(200) : std::min(left(), Milliseconds(1000));
      try {
        store_->wait({at + "/done"}, slice);
        return {};
      } catch (const TimeoutError&) {
      }
      if (gone || Clock::now() >= deadline) break;
      // Slow: make sure someone watches every worker — each its ring neighbour, connected if
      // it never was — and learn at once when another worker's shutdown failed.
      if (options_.failure_timeout.count() > 0 && Clock::now() - start >= options_.failure_timeout)
        transport_->probe(next);
      if (store_->add_within(kShutdownFailed, 0, left()) > 0) {
        others_failed = true;
        break;
      }
      gone = !gone_workers().empty();
    }
  } catch (const std::exception& e) {
    failed = e.what();  // the store is gone (its host died)
  }
  // Who did not come, with a budget of its own: the deadline may be spent.
  std::vector<std::string> missing;
  const auto ask_until = Clock::now() + std::min(store_->timeout(), Milliseconds(5000));
  try {
    for (int r = 0; r < n && failed.empty(); ++r)
      if (store_->add_within(key(phase, r), 0, until(ask_until, store_->timeout())) == 0)
        missing.push_back("'" + workers_[r].name + "'");
  } catch (const std::exception& e) {
    failed = e.what();
  }
  std::string why =
      !failed.empty() ? "the rendezvous store failed: " + failed
      : others_failed ? std::string("another worker's graceful shutdown failed (see its error)")
      : missing.empty()
          ? std::string("every worker arrived, but one stopped before it was counted")
          : gw::detail::str("worker(s) ", join(missing, ", "), " did not reach shutdown");
  if (const std::string gone = gone_workers(); !gone.empty()) why += "; " + gone;
  return why;
}

std::string Agent::gone_workers() const {
  std::vector<std::string> gone;
  for (const auto& w : workers_)
    if (std::string why = transport_->gone(w.id); !why.empty()) gone.push_back(std::move(why));
  return join(gone, "; ");
}

// Every step waits at most until `deadline`; the first that does not finish says why.
std::string Agent::drain(Clock::time_point deadline) {
  const auto left = [&] { return until(deadline, kDefaultRpcTimeout); };
  if (autograd_) {
    try {
      autograd_->flush(left());
    } catch (const std::exception& e) {
      log_error(self_.name, ": distributed autograd did not finish before shutdown: ", e.what());
    }
  }
  const std::string calls = "its own calls were still pending";
  if (!calls_->wait_empty(deadline)) return calls;
  rrefs_->release_users(left());
  if (!calls_->wait_empty(deadline)) return calls;  // ... and so are the deletes of our RRefs
  // Nobody starts new work for us after this barrier (handlers already running may: an RRef
  // they pass to a worker after its release is forgotten by its owner at stop) ...
  if (std::string why = barrier("shutdown-arrive", deadline); !why.empty()) return why;
  // ... and what we serve for others is done, with the calls it made.
  if (!dispatcher_->wait_idle(deadline)) return "requests it serves were still running";
  if (!calls_->wait_empty(deadline)) return calls;
  return barrier("shutdown-leave", deadline);  // everyone is done: connections may close
}

void Agent::shutdown(bool graceful, Milliseconds timeout) {
  if (!running_) return;
  GW_CHECK(t_owning_agent != this, StateError, "[shutdown] cannot shut down agent '", self_.name,
           "' from one of its own threads (a request handler or a future callback)");
  if (timeout == kUseDefaultTimeout) timeout = kNoTimeout;  // the default: no limit
  GW_CHECK(timeout.count() >= 0, InvalidArgumentError, "[shutdown] timeout must be >= 0 ms ",
           "(0 = none), got ", timeout.count());
  const auto deadline = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
  const std::string unfinished = graceful ? drain(deadline) : "";
  // Decided before stopping: peers that stop in turn must not turn a timeout into a death.
  const bool gone = !unfinished.empty() && !gone_workers().empty();
  if (!unfinished.empty()) {
    try {  // the others waiting in a barrier learn of it at once
      store_->add_within(kShutdownFailed, 1, Milliseconds(2000));
    } catch (const std::exception&) {
    }
  }
  stop("the RPC agent was shut down");
  if (graceful && unfinished.empty()) {
    // Rank 0 may own the store (TCPStore): keep it alive until everyone has left the barrier.
    try {
      const int64_t n = static_cast<int64_t>(workers_.size());
      const Milliseconds bound = until(deadline, store_->timeout());
      if (store_->add_within("rpc/shutdown-exit/arrived", 1, bound) == n)
        store_->add_within("rpc/shutdown-exit/done", 1, bound);
      if (self_.id == 0) store_->wait({"rpc/shutdown-exit/done"}, bound);
    } catch (const std::exception& e) {
      log_error(self_.name, ": not every worker left shutdown: ", e.what());
    }
  }
  if (unfinished.empty()) return;
  const std::string what = gw::detail::str(
      "[shutdown] worker '", self_.name, "' stopped without a graceful shutdown",
      timeout.count() > 0 ? gw::detail::str(" (timeout ", timeout.count(), " ms)") : "", ": ",
      unfinished);
  if (gone) throw IoError(what);
  throw TimeoutError(what);
}

void Agent::stop(const std::string& why) {
  running_ = false;
  // Pending calls fail with the reason, before closing connections would fail them with
  // "connection lost"; no call is added after this.
  calls_->close(why);
  transport_->stop(why);
  // Queued handlers still run (their responses find closed connections). An async function's
  // future may complete later, on another thread, and its callback uses this agent: wait for
  // those so that the agent can be destroyed. Bounded, for a function waiting on something
  // that never comes.
  const Milliseconds bound = rpc_timeout().count() > 0 ? rpc_timeout() : kDefaultRpcTimeout;
  if (int left = dispatcher_->stop(bound))
    log_error(self_.name, ": ", left, " request handler(s) still running after shutdown");
  rrefs_->forget_remote_forks();  // the network thread is joined: no RRef message can arrive
}

}  // namespace gw::rpc
