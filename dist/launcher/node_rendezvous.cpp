#include "dist/launcher/node_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "dist/launcher/line_forwarder.h"
#include "dist/store/net_address.h"
#include "dist/store/tcp_store.h"

namespace gw::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using dist::Milliseconds;

// How long the hosting node serves the store for nodes that have not read the job's end yet.
constexpr Milliseconds kLeaveTimeout{60'000};

Milliseconds ms(double seconds) { return Milliseconds(static_cast<int64_t>(seconds * 1000)); }

}  // namespace

NodeRendezvous::NodeRendezvous(const LaunchOptions& o) : options_(o) {
  const std::string& host = o.rdzv_host;
  dist::TCPStoreOptions store;
  store.port = static_cast<uint16_t>(o.rdzv_port);
  store.world_size = o.nnodes;
  store.timeout = ms(o.rdzv_timeout_s);
  // The node whose address HOST is hosts, unless another gwrun of this machine took the port
  // first; the others connect.
  const std::string ip = dist::resolve_host(host, "gwrun");
  if (dist::is_local_address(ip)) {
    store.is_master = true;
    // A name of this machine mapped to loopback: the store picks (all interfaces, with a key).
    store.bind_address = dist::names_this_host(host, ip) ? "" : ip;
    try {
      store_ = std::make_shared<dist::TCPStore>(host, store);
      hosting_ = true;
    } catch (const IoError&) {
      if (!dist::port_in_use(ip, store.port)) throw;
    }
  }
  if (!store_) {
    store.is_master = false;
    store_ = std::make_shared<dist::TCPStore>(host, store);
  }
}

// Keys of this job's rendezvous (--rdzv-id), per round: jobs sharing an endpoint do not mix.
std::string NodeRendezvous::key(int round, const std::string& name) const {
  return "gwrun/" + options_.rdzv_id + "/round/" + std::to_string(round) + "/" + name;
}

NodeRendezvous::Place NodeRendezvous::join(int round) {
  const std::string arrived = key(round, "arrived"), master = key(round, "master");
  node_rank_ = static_cast<int>(store_->add(arrived, 1)) - 1;
  GW_CHECK(node_rank_ < options_.nnodes, StateError, "[gwrun] more nodes than --nnodes ",
           options_.nnodes, " joined the rendezvous at ", options_.rdzv_endpoint);
  if (node_rank_ == options_.nnodes - 1) store_->set(arrived + "/all", std::string("1"));
  try {
    store_->wait({arrived + "/all"}, ms(options_.rdzv_timeout_s));
  } catch (const TimeoutError&) {
    throw TimeoutError(gw::detail::str(
        "[gwrun] rendezvous at ", options_.rdzv_endpoint, ": ", store_->add(arrived, 0), " of ",
        options_.nnodes, " nodes arrived within ", options_.rdzv_timeout_s, " s",
        round > 0 ? " for restart " + std::to_string(round) : std::string()));
  }
  if (node_rank_ == 0) {
    const std::string ip = dist::reachable_address(options_.rdzv_host, "gwrun");
    store_->set(master, ip + "\n" + std::to_string(dist::free_port(ip, "gwrun")));
  }
  store_->wait({master}, ms(options_.rdzv_timeout_s));
  const std::string value = store_->get_string(master);
  const auto nl = value.find('\n');
  return Place{node_rank_, value.substr(0, nl), std::stoi(value.substr(nl + 1))};
}

std::optional<NodeRendezvous::Failure> NodeRendezvous::failure(int round) {
  const std::string failed = key(round, "failed");
  if (!store_->check({failed})) return std::nullopt;
  // "<exit code> <restartable>\n<description>"
  const std::string value = store_->get_string(failed);
  const auto space = value.find(' '), nl = value.find('\n');
  return Failure{std::stoi(value.substr(0, space)), value.substr(space + 1, nl - space - 1) == "1",
                 value.substr(nl + 1)};
}

void NodeRendezvous::fail_round(int round, const Failure& f) {
  const std::string value = std::to_string(f.exit_code) + (f.restartable ? " 1" : " 0") +
                            "\nnode " + std::to_string(node_rank_) + ": " + f.description;
  store_->compare_set(key(round, "failed"), {}, dist::Bytes(value.begin(), value.end()));
}

std::optional<NodeRendezvous::Failure> NodeRendezvous::finish(int round) {
  const std::string done = key(round, "done"), all_done = done + "/all";
  if (store_->add(done, 1) == options_.nnodes) store_->set(all_done, std::string("1"));
  const auto deadline = Clock::now() + ms(options_.rdzv_timeout_s);
  while (!store_->check({all_done})) {
    if (auto f = failure(round)) return f;
    const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
    if (left <= Milliseconds(0)) {
      write_all(STDERR_FILENO,
                gw::detail::str("[gwrun] warning: ", store_->add(done, 0), " of ", options_.nnodes,
                                " nodes finished within ", options_.rdzv_timeout_s,
                                " s of this one; leaving without the others\n"));
      return std::nullopt;
    }
    try {  // wakes at once when the last node finishes; looks for failures in between
      store_->wait({all_done}, std::min(left, Milliseconds(250)));
    } catch (const TimeoutError&) {
    }
  }
  return std::nullopt;
}

void NodeRendezvous::leave(int round) {
  const std::string left = key(round, "left");
  if (store_->add(left, 1) == options_.nnodes) store_->set(left + "/all", std::string("1"));
  if (!hosting_) return;
  try {
    store_->wait({left + "/all"}, std::min(ms(options_.rdzv_timeout_s), kLeaveTimeout));
  } catch (const TimeoutError&) {
    write_all(STDERR_FILENO, "[gwrun] warning: not every node confirmed the end of the job\n");
  }
}

}  // namespace gw::launcher
