#include "store/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <vector>

#include "core/error.h"
#include "store/net_address.h"

namespace gw::store {
namespace {

constexpr const char* kOp = "launch environment";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const char* name, const std::string& text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  GW_CHECK(ec == std::errc() && end == text.data() + text.size(), InvalidArgumentError, "[", kOp,
           "] ", name, "='", text, "' is not an integer");
  return value;
}

// The integer variable `name`, or nullopt when unset.
std::optional<int> env_int(const char* name) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

// The integer variable `name`, required because `because` is set.
int need_int(const char* name, const char* because, const char* launcher) {
  auto v = env_int(name);
  GW_CHECK(v.has_value(), InvalidArgumentError, "[", kOp, "] ", because, " is set (", launcher,
           ") but ", name, " is not");
  return *v;
}

uint16_t parse_port(const char* name, const std::string& text) {
  const int port = parse_int(name, text);
  GW_CHECK(port > 0 && port <= 65535, InvalidArgumentError, "[", kOp, "] ", name, "=", port,
           " is not a port (1..65535)");
  return static_cast<uint16_t>(port);
}

// A port derived from a job's identity, the same on every rank: MASTER_PORT's stand-in for
// launchers that have none. Below Linux's ephemeral range (32768 and up), in a band of its own.
uint16_t derived_port(const std::string& job) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a: the same in every build
  for (const char c : job) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return static_cast<uint16_t>(kDerivedPortFirst + h % (kDerivedPortEnd - kDerivedPortFirst));
}

void check_ranks(LaunchEnv& e, const char* rank_var, const char* size_var, const char* local_var,
                 const char* local_size_var) {
  GW_CHECK(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size, InvalidArgumentError, "[",
           kOp, "] ", rank_var, "=", e.rank, " is outside [0, ", size_var, "=", e.world_size, ")");
  GW_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size && e.local_rank >= 0 &&
               e.local_rank < e.local_world_size,
           InvalidArgumentError, "[", kOp, "] ", local_var, "=", e.local_rank, " is outside [0, ",
           local_size_var, "=", e.local_world_size, ") or ", local_size_var, " exceeds ", size_var,
           "=", e.world_size);
}

// RANK and WORLD_SIZE: gwrun, torchrun, a PyTorchJob.
LaunchEnv from_torch_variables() {
  LaunchEnv e;
  e.launcher = env("TORCHELASTIC_RUN_ID")      ? "torchrun"
               : env("GW_LAUNCHER") == "gwrun" ? "gwrun"
               : env("LOCAL_RANK").has_value() ? "torchrun"
                                               : "env";
  const char* who = "gwrun, torchrun or a PyTorchJob";
  e.rank = need_int("RANK", "WORLD_SIZE", who);
  e.world_size = need_int("WORLD_SIZE", "RANK", who);
  e.local_rank = env_int("LOCAL_RANK").value_or(0);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(env("LOCAL_RANK") ? e.world_size : 1);
  check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  auto addr = env("MASTER_ADDR");
  auto port = env("MASTER_PORT");
  GW_CHECK(addr && port, InvalidArgumentError, "[", kOp, "] RANK=", e.rank,
           " and WORLD_SIZE=", e.world_size, " are set (", who, ") but ",
           !addr ? "MASTER_ADDR" : "MASTER_PORT", " is not");
  e.master_addr = *addr;
  e.master_port = parse_port("MASTER_PORT", *port);
  return e;
}

LaunchEnv from_openmpi() {
  LaunchEnv e;
  e.launcher = "openmpi";
  const char* who = "OpenMPI";
  e.rank = need_int("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", who);
  e.world_size = need_int("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", who);
  e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    GW_CHECK(e.local_world_size == e.world_size, InvalidArgumentError, "[", kOp,
             "] under mpirun across nodes (OMPI_COMM_WORLD_SIZE=", e.world_size,
             ", OMPI_COMM_WORLD_LOCAL_SIZE=", e.local_world_size,
             ") MASTER_ADDR must name the node of rank 0: mpirun -x MASTER_ADDR=<host> ...");
    e.master_addr = "127.0.0.1";
  }
  if (auto port = env("MASTER_PORT")) {
    e.master_port = parse_port("MASTER_PORT", *port);
  } else {
    auto job = env("PMIX_NAMESPACE");
    if (!job) job = env("OMPI_MCA_ess_base_jobid");
    if (!job) job = env("OMPI_MCA_orte_ess_jobid");
    GW_CHECK(job.has_value(), InvalidArgumentError, "[", kOp,
             "] under mpirun without MASTER_PORT, and no job id (PMIX_NAMESPACE) to derive a port "
             "from: mpirun -x MASTER_PORT=<port> ...");
    e.master_port = derived_port("openmpi/" + *job);
  }
  return e;
}

// "2(x3),1" (tasks per node, a count repeated) at node `node`.
std::optional<int> tasks_on_node(const std::string& spec, int node) {
  int at = 0;
  size_t i = 0;
  while (i < spec.size()) {
    const size_t end = std::min(spec.find(',', i), spec.size());
    const std::string item = spec.substr(i, end - i);
    const size_t paren = item.find("(x");
    const int count = parse_int("SLURM_STEP_TASKS_PER_NODE", item.substr(0, paren));
    const int repeat = paren == std::string::npos
                           ? 1
                           : parse_int("SLURM_STEP_TASKS_PER_NODE",
                                       item.substr(paren + 2, item.size() - paren - 3));
    if (node < at + repeat) return count;
    at += repeat;
    i = end + 1;
  }
  return std::nullopt;
}

LaunchEnv from_slurm() {
  LaunchEnv e;
  e.launcher = "slurm";
  const char* who = "Slurm";
  e.rank = *env_int("SLURM_PROCID");
  auto ntasks = env_int("SLURM_STEP_NUM_TASKS");
  e.world_size = ntasks ? *ntasks : need_int("SLURM_NTASKS", "SLURM_PROCID", who);
  e.local_rank = env_int("SLURM_LOCALID").value_or(0);
  e.local_world_size = 1;
  if (auto spec = env("SLURM_STEP_TASKS_PER_NODE")) {
    const int node = env_int("SLURM_NODEID").value_or(0);
    auto here = tasks_on_node(*spec, node);
    GW_CHECK(here.has_value(), InvalidArgumentError, "[", kOp, "] SLURM_STEP_TASKS_PER_NODE='",
             *spec, "' lists no node ", node, " (SLURM_NODEID)");
    e.local_world_size = *here;
  }
  check_ranks(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE");
  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    auto nodes = env("SLURM_STEP_NODELIST");
    if (!nodes) nodes = env("SLURM_JOB_NODELIST");
    GW_CHECK(nodes.has_value(), InvalidArgumentError, "[", kOp,
             "] under Slurm without MASTER_ADDR, and SLURM_JOB_NODELIST is not set");
    e.master_addr = first_slurm_host(*nodes);
  }
  if (auto port = env("MASTER_PORT")) {
    e.master_port = parse_port("MASTER_PORT", *port);
  } else {
    const auto job = env("SLURM_JOB_ID");
    GW_CHECK(job.has_value(), InvalidArgumentError, "[", kOp,
             "] under Slurm without MASTER_PORT, and SLURM_JOB_ID is not set");
    e.master_port = derived_port("slurm/" + *job + "/" + env("SLURM_STEP_ID").value_or("0"));
  }
  return e;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  for (size_t i = 0; i < nodelist.size() && nodelist[i] != ','; ++i) {
    if (nodelist[i] != '[') {
      host += nodelist[i];
      continue;
    }
    // A range set: its first number, as written (zero padding kept).
    const size_t close = nodelist.find(']', i);
    GW_CHECK(close != std::string::npos, InvalidArgumentError, "[", kOp, "] SLURM_JOB_NODELIST='",
             nodelist, "' has an unclosed '['");
    const std::string set = nodelist.substr(i + 1, close - i - 1);
    host += set.substr(0, set.find_first_of(",-"));
    i = close;
  }
  GW_CHECK(!host.empty(), InvalidArgumentError, "[", kOp, "] SLURM_JOB_NODELIST='", nodelist,
           "' names no host");
  return host;
}

LaunchEnv detect_launch_env() {
  if (env("RANK") || env("WORLD_SIZE")) return from_torch_variables();
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) return from_openmpi();
  // Inside an srun step only (srun alone sets the step's task counts): a batch script or an
  // interactive step has SLURM_PROCID too, but is not one of the job's tasks.
  if (env("SLURM_PROCID") && (env("SLURM_STEP_NUM_TASKS") || env("SLURM_STEP_TASKS_PER_NODE")))
    return from_slurm();
  return {};
}

std::string LaunchEnv::init_method() const {
  const bool v6 = master_addr.find(':') != std::string::npos;
  return gw::detail::str("tcp://", v6 ? "[" : "", master_addr, v6 ? "]" : "", ":", master_port);
}

std::string LaunchEnv::describe() const {
  return gw::detail::str(launcher, ": rank ", rank, " of ", world_size, " (local ", local_rank,
                         " of ", local_world_size, "), master ", master_addr, ":", master_port);
}

}  // namespace gw::store
