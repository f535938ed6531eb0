// The RRef protocol's state on one worker (PyTorch's RRefContext).
//
// Mental model: a value lives on its owner, in the owner table with the set of forks (user
// references on other workers) that keep it alive. Every worker that holds a reference holds an
// RRefHandle: an owner handle on the owner, a user handle (one fork) elsewhere. The protocol:
//   - remote(): the caller makes a user handle whose fork id is the RRef id and sends RRefCreate;
//     the owner records the fork, acknowledges (the handle is then confirmed) and runs the
//     function, whose result becomes the value. A fork may reach the owner before RRefCreate
//     does, so the owner creates entries on first sight and fills the value later.
//   - passing an RRef to worker Y makes a new fork. If the owner sends it, the owner records it
//     at once. If a user X sends it, X keeps its own handle alive (a pending child) until Y has
//     registered the fork with the owner (RRefFork) and told X (RRefAccept). Except when X sends
//     it home, to the owner, in a request: the request and X's later RRefDelete travel on X's one
//     connection to the owner and are handled in that order, so the owner holds the value (a
//     local handle) before it can see the delete. X then only keeps its handle until the request
//     is on its way (Message::keep_alive), and nobody sends RRefAccept: 2 frames less a call.
//   - a user handle's last copy going away sends RRefDelete; the owner drops the value when no
//     fork and no local handle is left.
// All control messages are handled one at a time by the receiving agent (on its network thread,
// or a shared-memory connection's thread), in each connection's arrival order.
// RRefContext is also the agent's first Interceptor (rpc/interceptor.h): RRefs in the values of
// every message sent become forks, and forks in every message received become RRefs.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "core/future.h"
#include "rpc/interceptor.h"
#include "rpc/ivalue.h"
#include "rpc/rref_id.h"

namespace gw::rpc {

class Agent;
class RRefContext;

// The owner's record of one value.
struct OwnerRRef {
  Future<IValue> value;  // completed when the creating function finishes (or fails)
  std::set<ForkId> forks;
  int local_handles = 0;
};

class RRefHandle {
 public:
  RRefHandle(std::weak_ptr<RRefContext> ctx, int owner, RRefId rref_id, ForkId fork_id)
      : ctx_(std::move(ctx)), owner_(owner), rref_id_(rref_id), fork_id_(fork_id) {}
  ~RRefHandle();
  RRefHandle(const RRefHandle&) = delete;
  RRefHandle& operator=(const RRefHandle&) = delete;

  int owner() const { return owner_; }
  bool is_owner() const { return owner_state_ != nullptr; }
  const RRefId& rref_id() const { return rref_id_; }
  const ForkId& fork_id() const { return fork_id_; }
  // Owner handles: the value's record. User handles: nullptr.
  const std::shared_ptr<OwnerRRef>& owner_state() const { return owner_state_; }
  // Completed once the owner knows this reference (at once for owner handles); fails if the
  // creating call failed or timed out.
  Future<void>& confirmed() { return confirmed_; }
  const Future<void>& confirmed() const { return confirmed_; }

 private:
  friend class RRefContext;
  std::weak_ptr<RRefContext> ctx_;
  int owner_;
  RRefId rref_id_;
  ForkId fork_id_;
  std::shared_ptr<OwnerRRef> owner_state_;
  Future<void> confirmed_;
  bool released_ = false;  // its fork was already deleted at shutdown
};

class RRefContext : public Interceptor, public std::enable_shared_from_this<RRefContext> {
 public:
  explicit RRefContext(Agent& agent) : agent_(agent) {}

  // Interceptor: fork() every RRef sent, cancel_fork() them if unsent, materialize() every fork
  // received (a late answer's handles go at once, releasing their forks).
  void outgoing(int to, Message& m, uint64_t autograd_context) override;
  void cancelled(Message& m) override;
  void incoming(int from, Message& m, Arrival arrival) override;

  // A local RRef: this worker owns `value`.
  std::shared_ptr<RRefHandle> create_owner(Future<IValue> value);
  // remote() to another worker: a user handle whose fork id is its RRef id, not yet confirmed.
  std::shared_ptr<RRefHandle> create_user_for_remote(int owner);

  // Sending `h` to another worker (or this one): makes the fork that travels. `home_by_request`:
  // a user handle goes to its owner in a request, which keeps it alive (no pending child).
  RRefForkData fork(const std::shared_ptr<RRefHandle>& h, bool home_by_request = false);
  // Receiving a fork: the handle this worker now holds. `by_request`: it came in a request from
  // its parent, which then expects no RRefAccept when this worker owns it.
  std::shared_ptr<RRefHandle> materialize(const RRefForkData& d, bool by_request = false);

  // Undoes fork() for a message that could not be sent.
  void cancel_fork(const RRefForkData& d);

  // Owner side of the control messages (network thread).
  std::shared_ptr<OwnerRRef> owner_entry(const RRefId& id);             // created on first sight
  std::shared_ptr<OwnerRRef> find_owner_entry(const RRefId& id) const;  // nullptr if gone
  void add_fork(const RRefId& id, const ForkId& fork);
  void delete_fork(const RRefId& id, const ForkId& fork);
  void accept_child(const ForkId& fork);

  // Graceful shutdown: waits (up to `timeout`) for the children this worker passed on to be
  // accepted, then deletes every user reference still alive here.
  void release_users(std::chrono::milliseconds timeout);
  // Waits until every RRef this worker passed on has been accepted by its receiver (and our
  // own reference released if it was the last); false on timeout.
  bool wait_children_accepted(std::chrono::milliseconds timeout);
  size_t num_owned() const;
  // The table sizes, for get_debug_info().
  struct Sizes {
    size_t owned, users, children_unaccepted;
  };
  Sizes sizes() const;
  // The agent has stopped: no RRef message reaches it any more, so forks held elsewhere can
  // never be used or deleted. Forgets them, and the records only they kept (a fork that
  // reached a worker after its last release, for one); this worker's own handles keep theirs.
  void forget_remote_forks();

 private:
  friend class RRefHandle;
  void on_handle_destroyed(RRefHandle& h);
  void send_delete(const RRefHandle& h);
  std::shared_ptr<OwnerRRef> owner_entry_locked(const RRefId& id);  // caller holds mu_
  ForkId new_id();
  // Drops the owner's record if nothing references it any more; returns it so that it is
  // destroyed outside the lock. Caller holds mu_.
  std::shared_ptr<OwnerRRef> maybe_drop_locked(const RRefId& id);

  Agent& agent_;
  mutable std::mutex mu_;
  std::condition_variable children_accepted_;
  std::map<RRefId, std::shared_ptr<OwnerRRef>> owners_;
  std::map<ForkId, std::shared_ptr<RRefHandle>> pending_children_;
  std::map<ForkId, std::weak_ptr<RRefHandle>> users_;
  int64_t next_local_ = 0;
};

}  // namespace gw::rpc
