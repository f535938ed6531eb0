// The agent's part of the RRef protocol (rpc/rref_context.h has the protocol itself): RRefs
// turned into forks and back as they cross the wire, remote(), to_here()'s fetch, and the
// protocol's system messages.
#include "rpc/agent.h"
#include "rpc/autograd_hook.h"
#include "rpc/protocol.h"
#include "rpc/rref_context.h"

namespace gw::rpc {

void Agent::fork_rrefs(IValue& v, std::vector<RRefForkData>& made) {
  if (!v.contains(IValue::Kind::kRRef)) return;
  v.transform([&](const IValue& x) -> std::optional<IValue> {
    if (!x.is(IValue::Kind::kRRef)) return std::nullopt;
    made.push_back(rrefs_->fork(x.to_rref()));
    return IValue::rref_fork(made.back());
  });
}

void Agent::materialize_rrefs(IValue& v) {
  if (!v.contains(IValue::Kind::kRRefFork)) return;
  v.transform([&](const IValue& x) -> std::optional<IValue> {
    if (!x.is(IValue::Kind::kRRefFork)) return std::nullopt;
    return IValue::rref(rrefs_->materialize(x.to_rref_fork()));
  });
}

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

void Agent::handle_rref(const std::shared_ptr<Connection>& c, uint64_t id, uint64_t autograd_ctx,
                        Request& r) {
  Future<IValue> none = Future<IValue>::ready(IValue());
  try {
    if (auto* m = std::get_if<RRefCreate>(&r)) {
      auto owner = rrefs_->owner_entry(m->rref_id);
      rrefs_->add_fork(m->rref_id, m->fork_id);
      respond(c, id, none);  // confirmed: the owner knows the fork
      run_function(m->function, std::move(m->args), autograd_ctx, [owner](Future<IValue>& v) {
        if (!owner->value.done()) owner->value.follow(v);
      });
    } else if (auto* m = std::get_if<RRefFetch>(&r)) {
      // Whoever asks holds a reference, so the value is here unless it was already released.
      auto owner = rrefs_->find_owner_entry(m->rref_id);
      GW_CHECK(owner, StateError, "[to_here] the RRef's value no longer exists on its owner '",
               self_.name, "' (all references to it were released)");
      owner->value.add_done_callback(
          [this, c, id, autograd_ctx](Future<IValue>& v) { respond(c, id, v, autograd_ctx); });
    } else if (auto* m = std::get_if<RRefFork>(&r)) {
      rrefs_->add_fork(m->rref_id, m->fork_id);
      respond(c, id, none);
    } else if (auto* m = std::get_if<RRefAccept>(&r)) {
      rrefs_->accept_child(m->fork_id);
      respond(c, id, none);
    } else if (auto* m = std::get_if<RRefDelete>(&r)) {
      rrefs_->delete_fork(m->rref_id, m->fork_id);
      respond(c, id, none);
    } else {
      throw InternalError("[rpc] " + describe(r) + " is not an RRef message");
    }
  } catch (...) {
    Future<IValue> failed = Future<IValue>::failed(std::current_exception());
    respond(c, id, failed);
  }
}

}  // namespace gw::rpc
