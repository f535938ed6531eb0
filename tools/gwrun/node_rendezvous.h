// gwrun's rendezvous across nodes (--rdzv-endpoint HOST:PORT), with the semantics of torchrun's
// c10d rendezvous: every node runs the same gwrun command, in any order; the node whose address
// HOST is hosts a TCPStore on HOST:PORT and the others connect to it. The nodes meet once per
// round: each receives a node rank in the order it arrived, and once --nnodes have arrived,
// node 0 names the master (its address toward HOST and a free port) for every worker's
// MASTER_ADDR and MASTER_PORT. A node that waits longer than --rdzv-timeout for the others
// fails, saying how many arrived. The store proves the job key like any other
// (GW_JOB_KEY_FILE, the same on every node).
//
// Rounds are how a job restarts across nodes (--max-restarts): a node whose worker failed says
// so in the store (fail_round); the others see it while they supervise (failure), stop their
// workers, and every node joins the next round, where the rendezvous forms again. A node whose
// workers all succeeded waits in finish() for the others, so that a late failure elsewhere
// still restarts it; the job ends when every node finished the same round.
//
//   NodeRendezvous nodes(options);      // connects to, or hosts, the store
//   for (int round = 0;; ++round) {
//     auto place = nodes.join(round);   // blocks until every node has arrived
//     ... start workers with place.node_rank, place.master_addr, place.master_port;
//     ... while they run: if (auto f = nodes.failure(round)) stop them; restart;
//     ... one failed: nodes.fail_round(round, {code, "rank 3 ... was killed"}); restart;
//     ... all succeeded: if (!nodes.finish(round)) done; else restart;
//   }
//   nodes.leave(exit_code);
//   // keep `nodes` alive while the job runs: the hosting node serves the store from it
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "store/store.h"
#include "tools/gwrun/options.h"

namespace gw::gwrun {

class NodeRendezvous {
 public:
  // Where this node is in a round.
  struct Place {
    int node_rank = 0;
    std::string master_addr;
    int master_port = 0;
  };
  // How a node's part of the job ended, as the other nodes read it: a worker failure
  // (restartable), an interruption or a gwrun error (not: the job ends everywhere), or, with
  // exit code 0, a node that left after its workers finished (no round can form again).
  struct Failure {
    int exit_code = 1;        // gwrun's exit code for it, if no restart is left
    bool restartable = true;  // false: the job ends
    std::string description;  // "node 1: rank 3 (pid 812) was killed by signal 9 (SIGKILL)"
  };

  // How often a wait looks for failures and interruptions, and gwrun at the store.
  static constexpr std::chrono::milliseconds kPollPeriod{250};

  // Thrown by a wait that stopped early: another node reported `failure` for the round, or
  // (failure empty) the interrupt predicate said so.
  struct Stopped {
    std::optional<Failure> failure;
  };

  // Hosts or connects to the store; throws IoError when it cannot, InvalidArgumentError on a
  // bad endpoint.
  explicit NodeRendezvous(const LaunchOptions& options);
  // From now on, waits ask `interrupted` every kPollPeriod whether to give up.
  void set_interrupt(std::function<bool()> interrupted) { interrupted_ = std::move(interrupted); }

  // Joins round `round` (0, 1, ...) and waits for every node. Throws TimeoutError ("k of N
  // nodes arrived") after options.rdzv_timeout_s, StateError when more than --nnodes join,
  // Stopped when the job has ended, a node reports a failure for the round meanwhile, or on
  // interruption.
  Place join(int round);
  // What a node reported for `round` or for the whole job, if anything; cheap enough to poll
  // (two store calls). Throws IoError when the store is gone (its node's gwrun ended).
  std::optional<Failure> failure(int round);
  // Reports this node's failure to every node: a restartable one for `round`, another for the
  // whole job (the first report stands); the description is prefixed with "node <rank>: ".
  // Nothing from a node that never joined.
  void fail_round(int round, const Failure& failure);
  // This node's workers of `round` all succeeded: waits until every node's did (nullopt), or
  // a node reports a failure for the round (returned). Waits at most options.rdzv_timeout_s,
  // then returns nullopt with a warning: this node's work is done. Throws Stopped (empty) on
  // interruption.
  std::optional<Failure> finish(int round);
  // This node is done with the job (with `exit_code`): the job's end for every node, unless a
  // node said otherwise first. The hosting node then serves the store until every node that
  // joined has left (up to a minute, or a new interruption), so that each reads how the job
  // ended. Nothing from a node that never joined.
  void leave(int exit_code);

 private:
  std::string key(int round, const std::string& name) const;
  std::string job_key(const std::string& name) const;
  std::optional<Failure> read(const std::string& key);
  void write(const std::string& key, const Failure& failure);  // unless the key is set
  // Waits until `key` exists (true) or `timeout` passes (false), kPollPeriod at a time; in
  // between throws Stopped on interruption and, with `watch`, on a failure of `round`.
  bool wait_key(int round, const std::string& key, store::Milliseconds timeout, bool watch);

  LaunchOptions options_;
  std::function<bool()> interrupted_;
  std::shared_ptr<store::Store> store_;  // the hosting node serves it from here
  bool hosting_ = false;
  bool member_ = false;  // joined a round: this node's reports count
  int node_rank_ = 0;    // in the current round
  // On node 0: the port it named for the current round's master, held until the next round
  // (store::HeldPort).
  std::optional<store::HeldPort> master_port_;
};

}  // namespace gw::gwrun
