#include "rpc/rref_context.h"

#include "core/log.h"
#include "rpc/agent.h"

namespace gw::rpc {

namespace {
// Sends a control message and ignores its answer (it is tracked as a pending call, so a
// graceful shutdown waits for it). Failures mean the peer is gone: nothing left to tell it.
Future<IValue> notify(Agent& agent, int to, Request message) {
  try {
    return agent.request(to, std::move(message));
  } catch (const std::exception&) {
    return Future<IValue>::failed(std::current_exception());
  }
}
}  // namespace

std::optional<Object> local_object(const IValue& v) {
  if (v.is(IValue::Kind::kObject)) return v.to_object();
  if (!v.is(IValue::Kind::kRRef) || !v.to_rref()->is_owner()) return std::nullopt;
  IValue value = v.to_rref()->owner_state()->value.wait();
  if (!value.is(IValue::Kind::kObject)) return std::nullopt;
  return value.to_object();
}

void RRefContext::outgoing(int to, Message& m, uint64_t /*autograd_context*/) {
  const bool request = m.request() != nullptr;
  try {
    for_each_value(m, [&](IValue& v) {
      if (!v.contains(IValue::Kind::kRRef)) return;
      v.transform([&](const IValue& x) -> std::optional<IValue> {
        if (!x.is(IValue::Kind::kRRef)) return std::nullopt;
        const auto& h = x.to_rref();
        const bool home = request && !h->is_owner() && h->owner() == to;
        // Until the request is written (or queued behind the connect): its delete follows it.
        if (home) m.keep_alive.push_back(h);
        return IValue::rref_fork(fork(h, home));
      });
    });
  } catch (...) {
    cancelled(m);  // the forks made before the failure
    throw;
  }
}

void RRefContext::cancelled(Message& m) {
  for_each_value(m, [&](IValue& v) {
    if (!v.contains(IValue::Kind::kRRefFork)) return;
    v.transform([&](const IValue& x) -> std::optional<IValue> {
      if (x.is(IValue::Kind::kRRefFork)) cancel_fork(x.to_rref_fork());
      return std::nullopt;
    });
  });
}

void RRefContext::incoming(int from, Message& m, Arrival arrival) {
  const bool request = arrival == Arrival::kRequest;
  for_each_value(m, [&](IValue& v) {
    if (!v.contains(IValue::Kind::kRRefFork)) return;
    v.transform([&](const IValue& x) -> std::optional<IValue> {
      if (!x.is(IValue::Kind::kRRefFork)) return std::nullopt;
      const RRefForkData& d = x.to_rref_fork();
      return IValue::rref(materialize(d, request && d.parent == from));
    });
  });
}

RRefHandle::~RRefHandle() {
  if (auto ctx = ctx_.lock()) ctx->on_handle_destroyed(*this);
}

ForkId RRefContext::new_id() {
  std::lock_guard lock(mu_);
  return {agent_.get_worker_info().id, next_local_++};
}

std::shared_ptr<RRefHandle> RRefContext::create_owner(Future<IValue> value) {
  RRefId id = new_id();
  auto state = std::make_shared<OwnerRRef>();
  state->value = std::move(value);
  state->local_handles = 1;
  auto h = std::make_shared<RRefHandle>(weak_from_this(), id.worker, id, id);
  h->owner_state_ = state;
  h->confirmed_.set_result();
  std::lock_guard lock(mu_);
  owners_[id] = state;
  return h;
}

std::shared_ptr<RRefHandle> RRefContext::create_user_for_remote(int owner) {
  RRefId id = new_id();
  auto h = std::make_shared<RRefHandle>(weak_from_this(), owner, id, id);
  std::lock_guard lock(mu_);
  users_[id] = h;
  return h;
}

RRefForkData RRefContext::fork(const std::shared_ptr<RRefHandle>& h, bool home_by_request) {
  const int self = agent_.get_worker_info().id;
  ForkId fork = new_id();
  std::lock_guard lock(mu_);
  if (h->is_owner()) {
    // The owner records the fork at once, even one sent to itself: until it is received the
    // message is the only thing referring to the value.
    h->owner_state_->forks.insert(fork);
  } else if (!home_by_request) {
    pending_children_[fork] = h;  // keeps our own fork alive until the child is accepted
  }
  return {h->owner(), h->rref_id(), fork, self};
}

std::shared_ptr<RRefHandle> RRefContext::materialize(const RRefForkData& d, bool by_request) {
  const int self = agent_.get_worker_info().id;
  agent_.get_worker_info(d.owner);  // validates the owner id
  auto h = std::make_shared<RRefHandle>(weak_from_this(), d.owner, d.rref_id, d.fork_id);
  if (d.owner == self) {
    {
      // Back home: the fork that carried it becomes a local handle.
      std::lock_guard lock(mu_);
      h->owner_state_ = owner_entry_locked(d.rref_id);
      h->owner_state_->forks.erase(d.fork_id);
      ++h->owner_state_->local_handles;
    }
    h->confirmed_.set_result();
    // A request's sender kept no pending child for it (see the header).
    if (d.parent != self && !by_request) notify(agent_, d.parent, RRefAccept{d.fork_id});
    return h;
  }
  {
    std::lock_guard lock(mu_);
    users_[d.fork_id] = h;
  }
  if (d.parent == d.owner) {  // the owner made this fork: it is registered already
    h->confirmed_.set_result();
    return h;
  }
  // A user made it: register it with the owner, then release the parent's hold.
  std::weak_ptr<RRefHandle> weak = h;
  notify(agent_, d.owner, RRefFork{d.rref_id, d.fork_id})
      .add_done_callback([this, weak, d, keep_alive = shared_from_this()](Future<IValue>& done) {
        if (auto h = weak.lock()) {
          if (auto e = done.exception())
            h->confirmed_.set_exception(e);
          else
            h->confirmed_.set_result();
        }
        notify(agent_, d.parent, RRefAccept{d.fork_id});
      });
  return h;
}

std::shared_ptr<OwnerRRef> RRefContext::owner_entry_locked(const RRefId& id) {
  auto& e = owners_[id];
  if (!e) e = std::make_shared<OwnerRRef>();
  return e;
}

std::shared_ptr<OwnerRRef> RRefContext::owner_entry(const RRefId& id) {
  std::lock_guard lock(mu_);
  return owner_entry_locked(id);
}

std::shared_ptr<OwnerRRef> RRefContext::find_owner_entry(const RRefId& id) const {
  std::lock_guard lock(mu_);
  auto it = owners_.find(id);
  return it == owners_.end() ? nullptr : it->second;
}

void RRefContext::cancel_fork(const RRefForkData& d) {
  if (d.owner == agent_.get_worker_info().id)
    delete_fork(d.rref_id, d.fork_id);
  else
    accept_child(d.fork_id);  // releases the hold we kept for the receiver
}

void RRefContext::add_fork(const RRefId& id, const ForkId& fork) {
  std::lock_guard lock(mu_);
  owner_entry_locked(id)->forks.insert(fork);
}

void RRefContext::send_delete(const RRefHandle& h) {
  notify(agent_, h.owner(), RRefDelete{h.rref_id(), h.fork_id()});
}

std::shared_ptr<OwnerRRef> RRefContext::maybe_drop_locked(const RRefId& id) {
  auto it = owners_.find(id);
  if (it == owners_.end() || !it->second->forks.empty() || it->second->local_handles > 0)
    return nullptr;
  auto dropped = std::move(it->second);
  owners_.erase(it);
  return dropped;
}

void RRefContext::delete_fork(const RRefId& id, const ForkId& fork) {
  std::shared_ptr<OwnerRRef> dropped;  // destroyed after the lock is released
  std::lock_guard lock(mu_);
  auto it = owners_.find(id);
  if (it == owners_.end()) return;
  it->second->forks.erase(fork);
  dropped = maybe_drop_locked(id);
}

void RRefContext::accept_child(const ForkId& fork) {
  std::shared_ptr<RRefHandle> child;  // may be our last reference: released outside the lock
  {
    std::lock_guard lock(mu_);
    auto it = pending_children_.find(fork);
    if (it == pending_children_.end()) return;
    child = std::move(it->second);
    pending_children_.erase(it);
  }
  child.reset();  // sends our delete, if that was our last reference, before waiters wake
  children_accepted_.notify_all();
}

bool RRefContext::wait_children_accepted(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return children_accepted_.wait_for(lock, timeout, [&] { return pending_children_.empty(); });
}

void RRefContext::on_handle_destroyed(RRefHandle& h) {
  if (h.is_owner()) {
    std::shared_ptr<OwnerRRef> dropped;
    std::lock_guard lock(mu_);
    --h.owner_state_->local_handles;
    dropped = maybe_drop_locked(h.rref_id());
    return;
  }
  {
    std::lock_guard lock(mu_);
    users_.erase(h.fork_id());
    if (h.released_) return;
  }
  if (agent_.running()) send_delete(h);
}

void RRefContext::release_users(std::chrono::milliseconds timeout) {
  if (!wait_children_accepted(timeout))
    log_error(agent_.get_worker_info().name,
              ": RRefs passed to other workers were never accepted; shutting down anyway");
  std::vector<std::shared_ptr<RRefHandle>> live;
  {
    std::lock_guard lock(mu_);
    for (auto& [fork, weak] : users_)
      if (auto h = weak.lock()) {
        h->released_ = true;
        live.push_back(h);
      }
    users_.clear();
  }
  for (auto& h : live) send_delete(*h);
}

void RRefContext::forget_remote_forks() {
  std::vector<std::shared_ptr<OwnerRRef>> dropped;  // destroyed after the lock is released
  std::lock_guard lock(mu_);
  for (auto it = owners_.begin(); it != owners_.end();) {
    it->second->forks.clear();
    if (it->second->local_handles > 0) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    it = owners_.erase(it);
  }
}

RRefContext::Sizes RRefContext::sizes() const {
  std::lock_guard lock(mu_);
  return {owners_.size(), users_.size(), pending_children_.size()};
}

size_t RRefContext::num_owned() const {
  std::lock_guard lock(mu_);
  return owners_.size();
}

}  // namespace gw::rpc
