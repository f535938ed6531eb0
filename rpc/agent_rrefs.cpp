// The agent's part of the RRef protocol (rpc/rref_context.h has the protocol itself): RRefs
// turned into forks and back as they cross the wire, remote(), to_here()'s fetch, and the
// protocol's system messages.
#include "rpc/agent.h"
#include "rpc/autograd_hook.h"
#include "rpc/message.h"
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
  using namespace rref_messages;
  auto h = rrefs_->create_user_for_remote(dst.id);
  IValueList msg{id_value(h->rref_id()), id_value(h->fork_id()), IValue(function),
                 IValue(std::move(args))};
  std::weak_ptr<RRefHandle> weak = h;
  call(dst, kRemote, std::move(msg), timeout).add_done_callback([weak](Future<IValue>& ack) {
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
  return call(rref->owner(), rref_messages::kFetch, {rref_messages::id_value(rref->rref_id())},
              timeout);
}

size_t Agent::num_owner_rrefs() const { return rrefs_->num_owned(); }

void Agent::handle_system(const std::shared_ptr<Connection>& c, Message& m) {
  using namespace rref_messages;
  Future<IValue> none = Future<IValue>::ready(IValue());
  const uint64_t ctx = m.autograd ? m.autograd->context_id : 0;
  try {
    const IValueList& a = m.args;
    auto need = [&](size_t n) {
      GW_CHECK(a.size() == n, IoError, "[rpc] ", m.function, " takes ", n, " arguments, got ",
               a.size());
    };
    if (m.function == kRemote) {  // rref id, fork id, function, args
      need(4);
      auto owner = rrefs_->owner_entry(id_from(a[0]));
      rrefs_->add_fork(id_from(a[0]), id_from(a[1]));
      respond(c, m.id, none);  // confirmed: the owner knows the fork
      run_function(a[2].to_string(), a[3].to_list(), ctx, [owner](Future<IValue>& r) {
        if (!owner->value.done()) owner->value.follow(r);
      });
    } else if (m.function == kFetch) {  // rref id
      need(1);
      // Whoever asks holds a reference, so the value is here unless it was already released.
      auto owner = rrefs_->find_owner_entry(id_from(a[0]));
      GW_CHECK(owner, StateError, "[to_here] the RRef's value no longer exists on its owner '",
               self_.name, "' (all references to it were released)");
      owner->value.add_done_callback(
          [this, c, id = m.id, ctx](Future<IValue>& v) { respond(c, id, v, ctx); });
    } else if (m.function == kFork) {  // rref id, fork id
      need(2);
      rrefs_->add_fork(id_from(a[0]), id_from(a[1]));
      respond(c, m.id, none);
    } else if (m.function == kAccept) {  // fork id
      need(1);
      rrefs_->accept_child(id_from(a[0]));
      respond(c, m.id, none);
    } else if (m.function == kDelete) {  // rref id, fork id
      need(2);
      rrefs_->delete_fork(id_from(a[0]), id_from(a[1]));
      respond(c, m.id, none);
    } else {
      throw InvalidArgumentError("[rpc] unknown system function '" + m.function + "'");
    }
  } catch (...) {
    Future<IValue> failed = Future<IValue>::failed(std::current_exception());
    respond(c, m.id, failed);
  }
}

}  // namespace gw::rpc
