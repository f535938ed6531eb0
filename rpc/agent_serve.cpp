// The serving side of the agent: a request's route from the network thread to its handler on
// the pool (recorded in the flight recorder and, when tracing, as a span with arrows), the cap
// on requests served per worker, and the response that carries the handler's outcome back.
#include <algorithm>

#include "core/log.h"
#include "core/trace.h"
#include "debug/flight_recorder.h"
#include "rpc/agent.h"
#include "rpc/autograd_hook.h"
#include "rpc/call_table.h"
#include "rpc/connection.h"
#include "rpc/dispatcher.h"
#include "rpc/function_table.h"
#include "rpc/message.h"
#include "rpc/transport.h"

namespace gw::rpc {

namespace {

// The span of a handler on its pool thread (core/trace.h), with the arrow from its caller's
// send and, unless the caller had its answer before (remote()), the arrow to that answer.
// Spans on one thread never overlap: a short one after another starts where that one ended.
class TraceServe {
 public:
  TraceServe(std::string name, int caller, uint64_t id, bool answer_flow)
      : name_(std::move(name)),
        caller_(caller),
        id_(id),
        answer_flow_(answer_flow),
        start_(std::max(trace::now_us(), t_last_end + 1)) {
    trace::flow(false, trace::rpc_flow(caller_, id_, false), start_ + 1, trace::current_thread());
  }
  ~TraceServe() {
    const int64_t end = std::max(trace::now_us(), start_ + 3);
    t_last_end = end;
    try {
      trace::complete("rpc", std::move(name_), start_, end, trace::current_thread());
      if (answer_flow_)
        trace::flow(true, trace::rpc_flow(caller_, id_, true), end - 1, trace::current_thread());
    } catch (...) {  // out of memory: the span is lost, not the handler's answer
    }
  }
  TraceServe(const TraceServe&) = delete;
  TraceServe& operator=(const TraceServe&) = delete;

 private:
  static inline thread_local int64_t t_last_end = 0;
  std::string name_;
  int caller_;
  uint64_t id_;
  bool answer_flow_;
  int64_t start_;
};

}  // namespace

// Network thread, in arrival order: the interceptors see the request (RRefs materialized, the
// distributed autograd context joined), then its variant picks the handler, and where it runs.
void Agent::on_request(const std::shared_ptr<Connection>& c, Message m) {
  const int from = c->peer_id();
  const uint64_t id = m.id;
  const uint64_t ctx = m.autograd ? m.autograd->context_id : 0;
  std::exception_ptr refused;
  try {
    receive(from, m, Arrival::kRequest);
  } catch (...) {
    refused = std::current_exception();
  }
  if (refused) {  // answered outside the catch: another thread may drop the error first
    auto held = std::make_shared<Message>(std::move(m));
    if (std::holds_alternative<RRefCreate>(*held->request()))
      return on_rref_request(c, held, std::move(refused));
    Future<IValue> failed = Future<IValue>::failed(std::move(refused));
    return respond(c, id, failed);
  }
  // The handlers that run on the pool take the message over, so that its arguments (and the
  // RRefs among them) are released when the handler is done, before its answer goes out.
  auto held = std::make_shared<Message>(std::move(m));
  const std::string what = describe(*held->request());
  std::visit(
      [&](auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, Call>) {
          // A function registered to run inline runs here, unless its call brings what the
          // pool's threads set up (a distributed autograd context, CUDA placements) or RRefs,
          // whose values may have to be waited for and whose deletes go out when released.
          auto fn = functions().find(r.function, r.args);
          const bool here =
              fn && fn->runs == Runs::kInline && ctx == 0 && held->placements.empty() &&
              std::ranges::none_of(r.args,
                                   [](const IValue& a) { return a.contains(IValue::Kind::kRRef); });
          serve(
              {.from = from, .id = id, .what = what, .runs = here ? Runs::kInline : Runs::kOnPool},
              ctx,
              [held = std::move(held), fn = std::move(fn)]() mutable {
                place_on_devices(*held);
                // The arguments are gone before the answer leaves: an RRef among them sends
                // its delete first, so the caller finds the owner's count already lowered.
                Call call = std::move(std::get<Call>(*held->request()));
                held.reset();
                // Without an overload, invoke() throws the error that names the candidates.
                return fn ? fn->invoke(call.args) : functions().invoke(call.function, call.args);
              },
              [this, c, id, ctx](Future<IValue>& done) { respond(c, id, done, ctx); });
        } else if constexpr (std::is_same_v<T, AutogradGradients> ||
                             std::is_same_v<T, AutogradDiscover> ||
                             std::is_same_v<T, AutogradRelease> ||
                             std::is_same_v<T, AutogradBackward>) {
          // A release frees what the others hold: never refused for the cap.
          serve(
              {from, id, what, !std::is_same_v<T, AutogradRelease>}, 0,
              [this, from, held = std::move(held)] {
                GW_CHECK(autograd_, InvalidArgumentError, "[rpc] worker '", self_.name,
                         "' cannot serve distributed autograd: start RPC with gw::dist::init_rpc "
                         "(dist/init_rpc.h)");
                place_on_devices(*held);
                return autograd_->handle(from, std::move(std::get<T>(*held->request())));
              },
              [this, c, id](Future<IValue>& done) { respond(c, id, done); });
        } else {
          on_rref_request(c, held);
        }
      },
      *held->request());
}

std::exception_ptr Agent::take_serving_slot(int from) {
  std::atomic<int>& n = serving_[static_cast<size_t>(from)];
  if (n.fetch_add(1) < options_.max_pending_requests_per_peer) return nullptr;
  n.fetch_sub(1);
  return std::make_exception_ptr(StateError(gw::detail::str(
      "[rpc] worker '", self_.name, "' is already serving ", options_.max_pending_requests_per_peer,
      " requests from '", workers_[from].name, "' (max_pending_requests_per_peer)")));
}

void Agent::serve(const Served& request, uint64_t ctx, std::function<Future<IValue>()> handler,
                  std::function<void(Future<IValue>&)> done) {
  const int from = request.from;
  if (request.counted) {
    if (auto refused = take_serving_slot(from)) {
      Future<IValue> failed = Future<IValue>::failed(refused);
      return done(failed);
    }
  }
  const uint64_t record = debug::record({.kind = debug::Kind::kRpcServe,
                                         .state = debug::State::kScheduled,
                                         .group = self_.name,
                                         .seq = static_cast<int64_t>(request.id),
                                         .op = request.what,
                                         .detail = workers_[from].name,
                                         .peer = from});
  auto release = [this, from, counted = request.counted, record](Future<IValue>& outcome) {
    if (counted) serving_[static_cast<size_t>(from)].fetch_sub(1);
    debug::finish(record, outcome.exception());
  };
  std::string span;  // the trace's name for the handler's span, when tracing
  if (trace::enabled()) span = request.what + " from " + workers_[from].name;
  try {
    dispatcher_->run(
        [record, from, id = request.id, answer_flow = request.answer_flow, span = std::move(span),
         handler = std::move(handler)] {
          debug::update(record, debug::State::kStarted);
          if (span.empty()) return handler();
          TraceServe traced(span, from, id, answer_flow);
          return handler();
        },
        ctx,
        [release, done = std::move(done)](Future<IValue>& outcome) {
          release(outcome);
          done(outcome);
        },
        request.runs);
  } catch (...) {
    Future<IValue> refused = Future<IValue>::failed(std::current_exception());
    release(refused);  // the pool refused it
    throw;
  }
}

void Agent::run_function(std::string function, IValueList args, uint64_t autograd_context,
                         std::function<void(Future<IValue>&)> done) {
  dispatcher_->run([function = std::move(function),
                    args = std::move(args)] { return functions().invoke(function, args); },
                   autograd_context, std::move(done));
}

void Agent::respond(const std::shared_ptr<Connection>& c, uint64_t id, Future<IValue>& result,
                    uint64_t autograd_context) {
  Message r;
  r.id = id;
  r.body = Response{};
  Response& out = *r.get<Response>();
  r.device_map = device_map_to(c->peer_id(), /*reply=*/true);
  auto failed = [&](const std::exception& e) {
    set_failure(out, self_.name, e);
    r.autograd.reset();
  };
  try {
    out.value = result.value();
    outgoing(c->peer_id(), r, autograd_context);
  } catch (const std::exception& e) {
    failed(e);  // outgoing() has undone itself
  } catch (...) {
    failed(std::runtime_error("the function threw something that is not a std::exception"));
  }
  try {
    c->send(r);
  } catch (const IoError&) {
    cancelled(r);  // the caller's connection is gone; its side has already failed the call
  } catch (const std::exception& e) {
    // The result cannot be sent (e.g. a CUDA tensor, an object): tell the caller why.
    cancelled(r);
    failed(e);
    try {
      c->send(r);
    } catch (const std::exception&) {
    }
  }
}

}  // namespace gw::rpc
