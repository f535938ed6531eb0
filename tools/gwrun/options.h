// gwrun's command line: torchrun's flags parsed into LaunchOptions, plus the usage texts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "store/net_address.h"

namespace gw::gwrun {

struct LaunchOptions {
  int nproc_per_node = 0;  // required; 0 until --nproc-per-node is seen
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          // 0: not given, see resolve_master_port
  double term_timeout_s = 5.0;  // grace between SIGTERM and SIGKILL when stopping workers
  // --max-restarts N: when a worker fails, stop them all and start them all again, up to N
  // times (torchrun's semantics), with GW_RESTART_COUNT set to the attempt's number.
  int max_restarts = 0;
  // --rdzv-endpoint HOST:PORT: the nodes meet there and receive their node ranks and the
  // master's address (node_rendezvous.h) instead of --node-rank and --master-addr.
  std::string rdzv_endpoint;  // as given, for messages; parsed into:
  std::string rdzv_host;      // brackets of an IPv6 literal removed
  int rdzv_port = 0;
  double rdzv_timeout_s = 900.0;    // how long a node waits for the others (torchrun's default)
  std::string rdzv_id = "default";  // the job's name at the endpoint (--rdzv-id)
  // --debug-on-timeout S: when no local worker has finished a collective or RPC for S seconds
  // while one waits, print the hang doctor's diagnosis and stop the job (hang_watch.h).
  double debug_on_timeout_s = 0;  // 0: off
  bool help = false;
  std::vector<std::string> command;  // the program and its arguments

  int rank_of(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Accepts `--flag value` and `--flag=value` (and torchrun's `--nproc_per_node` spelling);
// options stop at `--` or at the first argument that is not an option. Throws
// InvalidArgumentError naming the flag and the value on bad usage.
LaunchOptions parse_launch_options(int argc, const char* const argv[]);

// Sets options.master_port to the port workers rendezvous on: the one given, else on a single
// node a free port of 127.0.0.1, else torchrun's 29500. A port it picked comes back held (see
// store::HeldPort): keep it while the job runs, so that no concurrent job takes it before rank
// 0's store listens on it, or between restarts.
std::optional<store::HeldPort> resolve_master_port(LaunchOptions& options);

const char* usage_text();  // the synopsis, printed after a usage error
std::string help_text();   // synopsis and flags, for --help

}  // namespace gw::gwrun
