// gw::dist::Join — training on uneven inputs (torch.distributed.algorithms.Join, Joinable,
// JoinHook).
//
// Mental model: each iteration of a data-parallel loop issues the same collectives on every rank
// (DDP's gradient allreduces, its buffer broadcasts). A rank that runs out of data stops issuing
// them, and the ranks still training would wait for it until the group's timeout. Inside a Join,
// each iteration first announces itself: one small allreduce that says which ranks are still
// training. A rank whose loop is over calls join(), which keeps answering that announcement and,
// for each iteration of the others, *shadows* its collectives through its joinables' main hooks
// (DDP allreduces zeros for each bucket), until an announcement finds every rank joined. Then the
// post hooks run: DDP copies the parameters of a rank that trained longest to every rank.
//
//   gw::ddp::DistributedDataParallel model(net, pg);
//   gw::dist::Join join({&model});
//   for (auto& [x, y] : my_batches) {  // a different number of batches on each rank
//     opt.zero_grad();
//     loss_fn(model(x), y).backward();
//     opt.step();
//   }
//   join.join();  // shadows the others' iterations until every rank has joined
//
// Options as in PyTorch. throw_on_early_termination: once any rank has joined, every rank raises
// (a StateError at its next announcement; the joined rank in join()), for loops that must not go
// on with fewer ranks. divide_by_initial_world_size (DDP's): gradients are divided by the group's
// size, the joined ranks counting as zeros (true), or by the number of ranks still training
// (false: each iteration's gradient is that of the data its ranks saw). A DDP comm hook divides
// as it likes: the built-in hooks by the group's size, as in PyTorch.
//
// A Join whose join() is never called (an exception ended the loop) only detaches from its
// joinables: the other ranks then fail within the group's timeout, as they would without a Join.
// Every rank must train inside a Join with the same joinables, in the same order; with several,
// each iteration runs them in that order (forward and backward of the first, then the next), the
// first starting the iteration. A joined rank shadows an iteration by what its announcement
// said, so each announced iteration must issue what the joinable's hook shadows (DDP: a forward
// with grad enabled and outside no_sync is followed by its backward before the next forward).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dist/process_group/process_group.h"

namespace gw::dist {

struct JoinOptions {
  bool enable = true;  // false: the Join does nothing, and join() returns at once
  bool throw_on_early_termination = false;
  bool divide_by_initial_world_size = true;  // for the joinables' hooks (DDP)
};

// One iteration as its announcement saw it.
struct JoinIteration {
  std::vector<int> training;  // the ranks not joined yet, ascending (never empty)
};

// What a joined rank runs for the joinable: once per iteration of the ranks still training, the
// collectives that iteration issues; once at the end, whatever makes the ranks agree again.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  virtual void main_hook(const JoinIteration& /*iteration*/) {}
  virtual void post_hook(bool /*is_last_joiner*/) {}  // true: joined in the last iteration
};

class Join;

// A class whose per-iteration collectives a Join can shadow (DDP; PyTorch's Joinable).
class Joinable {
 public:
  virtual ~Joinable();
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  virtual std::shared_ptr<ProcessGroup> join_process_group() const = 0;

 protected:
  Joinable() = default;
  Joinable(const Joinable&) = delete;
  Joinable& operator=(const Joinable&) = delete;
  // The start of an iteration of a rank still training (DDP: each forward). Inside an enabled
  // Join, returns what the iteration's announcement found (made by the Join's first joinable;
  // the others read it); otherwise nullopt. Throws StateError when a rank terminated early.
  std::optional<JoinIteration> notify_join_context();
  // The options of the enclosing Join, if any.
  const JoinOptions* join_options() const;
  // Which Join encloses this joinable: a number no other Join of the process has, 0 for none.
  uint64_t join_id() const;

 private:
  friend class Join;
  Join* join_ = nullptr;
};

class Join {
 public:
  // Throws InvalidArgumentError when `joinables` is empty, holds a null or a joinable in another
  // Join, or when they train on different process groups; and whatever a joinable's join_hook
  // throws (made here, as in PyTorch).
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  ~Join();  // detaches from the joinables
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank's loop is over: shadows the other ranks' iterations until every rank has joined,
  // then runs the post hooks. Once per Join.
  void join();

 private:
  friend class Joinable;
  // The announcement: an allreduce in which a training rank sets its own slot (and reads whether
  // any rank asked to terminate), a joined rank sets none (or the termination slot).
  JoinIteration announce(bool training);
  std::optional<JoinIteration> notify(const Joinable& from);
  void detach();

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;  // by joinable
  std::shared_ptr<ProcessGroup> group_;
  JoinOptions options_;
  uint64_t id_;
  bool joined_ = false;
  JoinIteration last_;  // the latest announcement, for the joinables after the first
};

}  // namespace gw::dist
