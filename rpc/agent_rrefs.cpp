// The agent's part of the RRef protocol (rpc/rref_context.h has the protocol itself): remote(),
// to_here()'s fetch, and serving the protocol's messages. RRefs become forks and back as they
// cross the wire in RRefContext, one of the agent's interceptors.
#include "rpc/agent.h"
#include "rpc/autograd_hook.h"
#include "rpc/connection.h"
#include "rpc/dispatcher.h"
#include "rpc/function_table.h"
#include "rpc/protocol.h"
#include "rpc/rref_context.h"

namespace gw::rpc {

std::shared_ptr<RRefHandle> Agent::remote(const To& to, const std::string& function,
                                          IValueList args, Milliseconds timeout) {
  GW_CHECK(running_, StateError, "[remote] the RPC agent '", self_.name, "' is shut down");
  const WorkerInfo& dst = resolve(to);
  if (dst.id == self_.id) {  // this worker owns the result
    Future<IValue> value;
    auto h = rrefs_->create_owner(value);
    run_function(function, std::move(args), current_autograd_context(),
                 [value](Future<IValue>& r) mutable { value.follow(r); });
    return h;
  }
  auto h = rrefs_->create_user_for_remote(dst.id);
  std::weak_ptr<RRefHandle> weak = h;
  request(dst, RRefCreate{h->rref_id(), h->fork_id(), function, std::move(args)}, timeout)
      .add_done_callback([weak](Future<IValue>& ack) {
        if (auto h = weak.lock()) {
          if (auto e = ack.exception())
            h->confirmed().set_exception(e);
          else
            h->confirmed().set_result();
        }
      });
  return h;
}

Future<IValue> Agent::fetch(const std::shared_ptr<RRefHandle>& rref, Milliseconds timeout) {
  GW_CHECK(rref, InvalidArgumentError, "[to_here] the RRef is empty");
  if (rref->is_owner()) return rref->owner_state()->value;
  // A creation that failed (its remote() call raised or timed out) fails every use.
  if (rref->confirmed().has_error()) return Future<IValue>::failed(rref->confirmed().exception());
  return request(rref->owner(), RRefFetch{rref->rref_id()}, timeout);
}

size_t Agent::num_owner_rrefs() const { return rrefs_->num_owned(); }

// Network thread, in arrival order: a fork registered before its delete stays registered.
void Agent::on_rref_request(const std::shared_ptr<Connection>& c, const std::shared_ptr<Message>& m,
                            std::exception_ptr arrival_failed) {
  const uint64_t id = m->id;
  const uint64_t ctx = m->autograd ? m->autograd->context_id : 0;
  Future<IValue> none = Future<IValue>::ready(IValue());
  std::exception_ptr error;
  try {
    Request& r = *m->request();
    if (auto* create = std::get_if<RRefCreate>(&r)) {
      auto owner = rrefs_->owner_entry(create->rref_id);
      rrefs_->add_fork(create->rref_id, create->fork_id);
      respond(c, id, none);  // confirmed: the owner knows the fork
      // From here on the outcome is the value's: whoever holds the RRef sees it on to_here().
      auto settle = [owner](Future<IValue>& v) {
        if (!owner->value.done()) owner->value.follow(v);
      };
      std::exception_ptr failure = arrival_failed;
      if (!failure) {
        try {
          serve(
              {c->peer_id(), id, describe(r), true, /*answer_flow=*/false}, ctx,
              [m] {
                place_on_devices(*m);
                const RRefCreate& create = std::get<RRefCreate>(*m->request());
                return functions().invoke(create.function, create.args);
              },
              settle);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      if (failure) {  // outside the catch: a waiter on another thread may drop it first
        Future<IValue> failed = Future<IValue>::failed(std::move(failure));
        settle(failed);
      }
      return;
    }
    if (auto* fetch = std::get_if<RRefFetch>(&r)) {
      // Whoever asks holds a reference, so the value is here unless it was already released.
      auto owner = rrefs_->find_owner_entry(fetch->rref_id);
      GW_CHECK(owner, StateError, "[to_here] the RRef's value no longer exists on its owner '",
               self_.name, "' (all references to it were released)");
      owner->value.add_done_callback(
          [this, c, id, ctx](Future<IValue>& v) { respond(c, id, v, ctx); });
    } else if (auto* fork = std::get_if<RRefFork>(&r)) {
      rrefs_->add_fork(fork->rref_id, fork->fork_id);
      respond(c, id, none);
    } else if (auto* accept = std::get_if<RRefAccept>(&r)) {
      rrefs_->accept_child(accept->fork_id);
      respond(c, id, none);
    } else if (auto* del = std::get_if<RRefDelete>(&r)) {
      rrefs_->delete_fork(del->rref_id, del->fork_id);
      respond(c, id, none);
    } else {
      throw InternalError("[rpc] " + describe(r) + " is not an RRef message");
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {  // outside the catch: the caller may drop the error first
    Future<IValue> failed = Future<IValue>::failed(std::move(error));
    respond(c, id, failed);
  }
}

}  // namespace gw::rpc
