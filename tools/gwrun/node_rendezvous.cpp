#include "tools/gwrun/node_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "core/error.h"
#include "store/net_address.h"
#include "store/tcp_store.h"
#include "tools/gwrun/line_forwarder.h"

namespace gw::gwrun {
namespace {

using Clock = std::chrono::steady_clock;
using store::Milliseconds;

// How long the hosting node serves the store for nodes that have not read the job's end yet.
constexpr Milliseconds kLeaveTimeout{60'000};
// The bound of one store call once connected: a silent store host must not freeze gwrun (its
// output forwarding, its signals) for --rdzv-timeout; long waits go through wait_key.
constexpr Milliseconds kStoreCallTimeout{30'000};
// How long a node of the store's host connects before trying to host the store itself.
constexpr Milliseconds kHostRetry{1'000};

Milliseconds ms(double seconds) { return Milliseconds(static_cast<int64_t>(seconds * 1000)); }

}  // namespace

NodeRendezvous::NodeRendezvous(const LaunchOptions& o) : options_(o) {
  const std::string& host = o.rdzv_host;
  store::TCPStoreOptions store;
  store.port = static_cast<uint16_t>(o.rdzv_port);
  store.world_size = o.nnodes;
  store.timeout = ms(o.rdzv_timeout_s);
  const std::string ip = store::resolve_host(host, "gwrun");
  if (!store::is_local_address(ip)) {  // another host serves the store: wait for it
    store_ = std::make_shared<store::TCPStore>(host, store);
  } else {
    // The node whose address HOST is hosts, unless another gwrun of this machine did first; the
    // others connect. Two nodes of this machine can both fail to listen (each sees the other
    // listening at once, as two sockets bound with SO_REUSEADDR can), or one can fail to listen
    // beside a server about to go away: so a node that cannot connect within a moment tries to
    // host again, until --rdzv-timeout.
    const auto deadline = Clock::now() + store.timeout;
    std::minstd_rand jitter(std::random_device{}());
    for (;;) {
      try {
        store::TCPStoreOptions master = store;
        master.is_master = true;
        // A name of this machine mapped to loopback: the store picks (all interfaces, with a
        // key).
        master.bind_address = store::names_this_host(host, ip) ? "" : ip;
        store_ = std::make_shared<store::TCPStore>(host, master);
        hosting_ = true;
        break;
      } catch (const IoError&) {
        if (!store::port_in_use(ip, store.port)) throw;
      }
      const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
      GW_CHECK(left > Milliseconds(0), TimeoutError, "[gwrun] rendezvous at ", o.rdzv_endpoint,
               ": no node could host its store within ", o.rdzv_timeout_s, " s");
      store::TCPStoreOptions client = store;
      client.timeout = std::min(kHostRetry, left);
      try {
        store_ = std::make_shared<store::TCPStore>(host, client);
        break;
      } catch (const TimeoutError&) {  // nobody serves: host (the check above ends it in time)
      }
      std::this_thread::sleep_for(Milliseconds(10 + jitter() % 40));  // not in step again
    }
  }
  store_->set_timeout(std::min(store.timeout, kStoreCallTimeout));
}

// Keys of this job's rendezvous (--rdzv-id), per round: jobs sharing an endpoint do not mix.
std::string NodeRendezvous::key(int round, const std::string& name) const {
  return job_key("round/" + std::to_string(round) + "/" + name);
}

std::string NodeRendezvous::job_key(const std::string& name) const {
  return "gwrun/" + options_.rdzv_id + "/" + name;
}

bool NodeRendezvous::wait_key(int round, const std::string& key, Milliseconds timeout, bool watch) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (store_->check({key})) return true;
    if (interrupted_ && interrupted_()) throw Stopped{};
    if (watch) {
      if (auto f = failure(round)) throw Stopped{std::move(f)};
    }
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    if (left <= Milliseconds(0)) return false;
    try {  // wakes at once when the key appears
      store_->wait({key}, std::min(left, Milliseconds(kPollPeriod)));
      return true;
    } catch (const TimeoutError&) {
    }
  }
}

NodeRendezvous::Place NodeRendezvous::join(int round) {
  // A job that has ended (a node left it, or was interrupted) forms no round again; nor does a
  // new launch find the store of an old one still serving.
  if (auto ended = read(job_key("ended")))
    throw Stopped{Failure{ended->exit_code == 0 ? 1 : ended->exit_code, false,
                          "no rendezvous at " + options_.rdzv_endpoint + " for --rdzv-id " +
                              options_.rdzv_id + ": the job has ended (" + ended->description +
                              ")"}};
  const std::string arrived = key(round, "arrived"), master = key(round, "master");
  // A stray gwrun (a second launch of a node while the job runs) must not disturb the job.
  GW_CHECK(round > 0 || !store_->check({arrived + "/all"}), StateError, "[gwrun] the job at ",
           options_.rdzv_endpoint, " with --rdzv-id ", options_.rdzv_id,
           " is running already with its ", options_.nnodes, " nodes");
  master_port_.reset();  // the last round's, if this node named it: free for this round's pick
  node_rank_ = static_cast<int>(store_->add(arrived, 1)) - 1;
  if (node_rank_ >= options_.nnodes) {
    store_->add(arrived, -1);
    throw StateError(gw::detail::str("[gwrun] more nodes than --nnodes ", options_.nnodes,
                                     " joined the rendezvous at ", options_.rdzv_endpoint));
  }
  member_ = true;
  if (node_rank_ == options_.nnodes - 1) {
    store_->set(arrived + "/all", std::string("1"));
  } else {
    write_all(STDERR_FILENO, gw::detail::str("[gwrun] rendezvous at ", options_.rdzv_endpoint,
                                             ": node ", node_rank_ + 1, " of ", options_.nnodes,
                                             " arrived, waiting for the others\n"));
  }
  try {
    if (!wait_key(round, arrived + "/all", ms(options_.rdzv_timeout_s), true)) {
      throw TimeoutError(gw::detail::str(
          "[gwrun] rendezvous at ", options_.rdzv_endpoint, ": ", store_->add(arrived, 0), " of ",
          options_.nnodes, " nodes arrived within ", options_.rdzv_timeout_s, " s",
          round > 0 ? " for restart " + std::to_string(round) : std::string()));
    }
    if (node_rank_ == 0) {
      const std::string ip = store::reachable_address(options_.rdzv_host, "gwrun");
      master_port_ = store::hold_free_port(ip, "gwrun");
      store_->set(master, ip + "\n" + std::to_string(master_port_->port()));
    }
    GW_CHECK(wait_key(round, master, ms(options_.rdzv_timeout_s), true), TimeoutError,
             "[gwrun] rendezvous at ", options_.rdzv_endpoint, ": node 0 named no master within ",
             options_.rdzv_timeout_s, " s");
  } catch (Stopped& stopped) {
    // A node that left after its workers finished: no restart can form without it.
    if (stopped.failure && stopped.failure->exit_code == 0)
      stopped.failure = Failure{1, false, "no restart: " + stopped.failure->description};
    throw;
  }
  const std::string value = store_->get_string(master);
  const auto nl = value.find('\n');
  return Place{node_rank_, value.substr(0, nl), std::stoi(value.substr(nl + 1))};
}

// "<exit code> <restartable>\n<description>"
std::optional<NodeRendezvous::Failure> NodeRendezvous::read(const std::string& key) {
  if (!store_->check({key})) return std::nullopt;
  const std::string value = store_->get_string(key);
  const auto space = value.find(' '), nl = value.find('\n');
  GW_CHECK(space < nl && nl != std::string::npos, IoError, "[gwrun] the rendezvous key ", key,
           " holds no failure: '", value, "'");
  return Failure{std::stoi(value.substr(0, space)), value.substr(space + 1, nl - space - 1) == "1",
                 value.substr(nl + 1)};
}

void NodeRendezvous::write(const std::string& key, const Failure& f) {
  const std::string value = std::to_string(f.exit_code) + (f.restartable ? " 1" : " 0") +
                            "\nnode " + std::to_string(node_rank_) + ": " + f.description;
  store_->compare_set(key, {}, store::Bytes(value.begin(), value.end()));
}

std::optional<NodeRendezvous::Failure> NodeRendezvous::failure(int round) {
  if (auto failed = read(key(round, "failed"))) return failed;
  return read(job_key("ended"));
}

void NodeRendezvous::fail_round(int round, const Failure& f) {
  if (!member_) return;  // a node that never joined speaks for nobody
  write(f.restartable ? key(round, "failed") : job_key("ended"), f);
}

std::optional<NodeRendezvous::Failure> NodeRendezvous::finish(int round) {
  const std::string done = key(round, "done"), all_done = done + "/all";
  if (store_->add(done, 1) == options_.nnodes) store_->set(all_done, std::string("1"));
  try {
    if (wait_key(round, all_done, ms(options_.rdzv_timeout_s), true)) return std::nullopt;
  } catch (const Stopped& stopped) {
    if (!stopped.failure) throw;  // interrupted
    // A node that left after its own workers finished gave up waiting: so does this one.
    if (stopped.failure->exit_code == 0) return std::nullopt;
    return stopped.failure;
  }
  write_all(STDERR_FILENO,
            gw::detail::str("[gwrun] warning: ", store_->add(done, 0), " of ", options_.nnodes,
                            " nodes finished within ", options_.rdzv_timeout_s,
                            " s of this one; leaving without the others\n"));
  return std::nullopt;
}

void NodeRendezvous::leave(int exit_code) {
  if (!member_) return;
  // The job has ended for this node: no round forms again (unless a failure said it first).
  write(job_key("ended"),
        Failure{exit_code, false,
                exit_code == 0 ? "left the job"
                               : "left the job with exit code " + std::to_string(exit_code)});
  // The hosting node waits for every member (each arrived in round 0, and leaves once; an
  // interrupted first rendezvous may have fewer than --nnodes).
  const std::string left = job_key("left");
  const int64_t members = store_->add(key(0, "arrived"), 0);
  if (store_->add(left, 1) >= members) store_->set(left + "/all", std::string("1"));
  if (!hosting_) return;
  try {
    if (!wait_key(0, left + "/all", std::min(ms(options_.rdzv_timeout_s), kLeaveTimeout), false))
      write_all(STDERR_FILENO, "[gwrun] warning: not every node confirmed the end of the job\n");
  } catch (const Stopped&) {
    // Interrupted: stop serving now.
  }
}

}  // namespace gw::gwrun
