// Parsing and checking gwrun's command line.
#include "tools/gwrun/options.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "core/error.h"
#include "store/net_address.h"

namespace gw::gwrun {
namespace {

constexpr int kMaxProcsPerNode = 4096;
constexpr int kMaxNodes = 1 << 16;
constexpr int kTorchrunDefaultPort = 29500;

constexpr const char* kUsage =
    "usage: gwrun --nproc-per-node N [--nnodes M] [--node-rank R] [--master-addr A]\n"
    "             [--master-port P] [--rdzv-endpoint HOST:PORT] [--rdzv-timeout S]\n"
    "             [--max-restarts N] [--term-timeout S] [--debug-on-timeout S]\n"
    "             [--] prog [args...]\n";

constexpr const char* kFlags =
    "\n"
    "Starts N worker processes with the torch.distributed environment.\n"
    "  --nproc-per-node N  workers on this node (required)\n"
    "  --nnodes M          nodes in the job (default 1)\n"
    "  --node-rank R       this node's index, 0..M-1 (default 0)\n"
    "  --master-addr A     rank 0's host (default 127.0.0.1)\n"
    "  --master-port P     rank 0's port (default: a free port on one node, else 29500)\n"
    "  --rdzv-endpoint H:P the nodes, started in any order, meet at H:P (the node whose\n"
    "                      address H is hosts it) and receive their node ranks and the\n"
    "                      master's address: no --node-rank or --master-addr needed\n"
    "  --rdzv-timeout S    seconds a node waits for the others to arrive (default 900)\n"
    "  --rdzv-id ID        the job's name at the endpoint, for jobs that share one\n"
    "  --max-restarts N    when a worker fails, stop all and start all again, at most N\n"
    "                      times (default 0); workers see GW_RESTART_COUNT (and\n"
    "                      TORCHELASTIC_RESTART_COUNT) and may resume from a checkpoint;\n"
    "                      across nodes (with --rdzv-endpoint) every node restarts and\n"
    "                      the rendezvous forms again\n"
    "  --term-timeout S    seconds between SIGTERM and SIGKILL when stopping (default 5)\n"
    "  --debug-on-timeout S  when no worker has finished a collective or an RPC for S\n"
    "                      seconds while one waits, gather every worker's debug info,\n"
    "                      print which rank is where, and stop the job (exit code 1)\n"
    "\n"
    "Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR and MASTER_PORT; its output lines are prefixed with \"[RANK] \".\n"
    "If a worker fails, the others are stopped and gwrun exits with its code\n"
    "(128+signal if it was killed by a signal).\n";

// Parses the whole of `value` as a number in [lo, hi]; `flag` names it in the error.
template <typename T>
T parse_number(std::string_view flag, std::string_view value, T lo, T hi) {
  T result{};
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), result);
  GW_CHECK(ec == std::errc() && end == value.data() + value.size() && result >= lo && result <= hi,
           InvalidArgumentError, "[gwrun] ", flag, " must be a number in [", lo, ", ", hi,
           "], got '", value, "'");
  return result;
}

// Stores one flag's value; returns false for a flag gwrun does not know.
bool apply_flag(LaunchOptions& o, std::string_view flag, std::string_view value) {
  if (flag == "--nproc-per-node") {
    o.nproc_per_node = parse_number(flag, value, 1, kMaxProcsPerNode);
  } else if (flag == "--nnodes") {
    o.nnodes = parse_number(flag, value, 1, kMaxNodes);
  } else if (flag == "--node-rank") {
    o.node_rank = parse_number(flag, value, 0, kMaxNodes - 1);
  } else if (flag == "--master-addr") {
    GW_CHECK(!value.empty(), InvalidArgumentError, "[gwrun] --master-addr must not be empty");
    o.master_addr = value;
  } else if (flag == "--master-port") {
    o.master_port = parse_number(flag, value, 1, 65535);
  } else if (flag == "--rdzv-endpoint") {
    const auto colon = value.rfind(':');
    GW_CHECK(colon != std::string_view::npos && colon > 0, InvalidArgumentError,
             "[gwrun] --rdzv-endpoint must be HOST:PORT, got '", value, "'");
    o.rdzv_endpoint = value;
    std::string_view host = value.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    o.rdzv_host = host;
    o.rdzv_port = parse_number(flag, value.substr(colon + 1), 1, 65535);
  } else if (flag == "--rdzv-timeout") {
    o.rdzv_timeout_s = parse_number(flag, value, 0.1, 86400.0);
  } else if (flag == "--rdzv-id") {
    GW_CHECK(!value.empty(), InvalidArgumentError, "[gwrun] --rdzv-id must not be empty");
    o.rdzv_id = value;
  } else if (flag == "--rdzv-backend") {
    // torchrun's: gwrun's rendezvous is always its own store, with c10d's semantics.
  } else if (flag == "--max-restarts") {
    o.max_restarts = parse_number(flag, value, 0, 1000);
  } else if (flag == "--debug-on-timeout") {
    o.debug_on_timeout_s = parse_number(flag, value, 0.0, 86400.0);
  } else if (flag == "--term-timeout") {
    o.term_timeout_s = parse_number(flag, value, 0.0, 3600.0);
  } else {
    return false;
  }
  return true;
}

}  // namespace

LaunchOptions parse_launch_options(int argc, const char* const argv[]) {
  LaunchOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (!arg.starts_with("--")) break;  // the program: everything from here is its argv
    size_t eq = arg.find('=');
    std::string flag(arg.substr(0, eq));
    std::replace(flag.begin() + 2, flag.end(), '_', '-');  // torchrun accepts both spellings
    std::string_view value;
    if (eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
    } else {
      GW_CHECK(i + 1 < argc, InvalidArgumentError, "[gwrun] ", flag, " needs a value");
      value = argv[++i];
    }
    GW_CHECK(apply_flag(o, flag, value), InvalidArgumentError, "[gwrun] unknown option '", arg,
             "'");
  }
  o.command.assign(argv + i, argv + argc);
  GW_CHECK(o.nproc_per_node > 0, InvalidArgumentError, "[gwrun] missing --nproc-per-node");
  GW_CHECK(o.node_rank < o.nnodes, InvalidArgumentError, "[gwrun] --node-rank ", o.node_rank,
           " is out of range for --nnodes ", o.nnodes, " (expected 0..", o.nnodes - 1, ")");
  GW_CHECK(!o.command.empty(), InvalidArgumentError, "[gwrun] no program to run");
  GW_CHECK(o.max_restarts == 0 || o.nnodes == 1 || !o.rdzv_endpoint.empty(), InvalidArgumentError,
           "[gwrun] --max-restarts across nodes (--nnodes ", o.nnodes,
           ") needs --rdzv-endpoint: the nodes meet again there for each restart");
  GW_CHECK(o.rdzv_endpoint.empty() || (o.node_rank == 0 && o.master_addr == "127.0.0.1"),
           InvalidArgumentError,
           "[gwrun] --rdzv-endpoint assigns node ranks and the master: drop --node-rank and "
           "--master-addr");
  return o;
}

std::optional<store::HeldPort> resolve_master_port(LaunchOptions& options) {
  if (options.master_port != 0) return std::nullopt;
  if (options.nnodes > 1) {
    options.master_port = kTorchrunDefaultPort;
    return std::nullopt;
  }
  store::HeldPort held = store::hold_free_port("127.0.0.1", "gwrun");
  options.master_port = held.port();
  return held;
}

const char* usage_text() { return kUsage; }

std::string help_text() { return std::string(kUsage) + kFlags; }

}  // namespace gw::gwrun
