// gwrun, gradwire's torchrun: starts --nproc-per-node workers with the torch.distributed
// environment and a job key, forwards their output prefixed by rank, and stops them all if one
// fails (then, with --max-restarts, starts them all again).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/trace.h"
#include "tools/gwrun/guardian.h"
#include "tools/gwrun/job_key_file.h"
#include "tools/gwrun/node_rendezvous.h"
#include "tools/gwrun/options.h"
#include "tools/gwrun/supervisor.h"

namespace {

constexpr int kUsageExitCode = 2;  // what argparse-based torchrun uses for bad usage

// With GW_TRACE=FILE, every worker wrote FILE.rank<R>.json (core/trace.h): this node's ranks'
// files of this job (written since `started`) go into FILE, one timeline per rank; across
// nodes, into FILE.node<N>.json, each node its own.
void merge_traces(const gw::gwrun::LaunchOptions& options,
                  std::filesystem::file_time_type started) {
  const char* env = std::getenv("GW_TRACE");
  if (env == nullptr || *env == '\0') return;
  const std::string path =
      options.nnodes > 1 ? env + (".node" + std::to_string(options.node_rank) + ".json") : env;
  std::vector<std::string> parts;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    std::string part =
        std::string(env) + ".rank" + std::to_string(options.rank_of(local)) + ".json";
    std::error_code ec;
    if (std::filesystem::last_write_time(part, ec) >= started && !ec) parts.push_back(part);
  }
  if (parts.empty()) return;
  try {
    gw::trace::merge(parts, path);
    std::fprintf(stderr,
                 "[gwrun] the trace of %zu rank(s) is in %s: open it at "
                 "https://ui.perfetto.dev\n",
                 parts.size(), path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[gwrun] could not merge the traces: %s\n", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gw::gwrun;
  gw::trace::cancel();  // GW_TRACE is the workers'
  if (argc > 1 && std::string_view(argv[1]) == kGuardianFlag) return run_guardian(argc, argv);
  try {
    LaunchOptions options = parse_launch_options(argc, argv);
    if (options.help) {
      std::fputs(help_text().c_str(), stdout);
      return 0;
    }
    const JobKeyFile key(options.nnodes);  // the workers' GW_JOB_KEY_FILE, removed at the end
    std::optional<NodeRendezvous> nodes;   // with --rdzv-endpoint; its store lives with the job
    std::optional<gw::store::HeldPort> master_port;  // one gwrun picked, held for the job
    if (!options.rdzv_endpoint.empty()) {
      nodes.emplace(options);
    } else {
      master_port = resolve_master_port(options);
    }
    const auto started = std::filesystem::file_time_type::clock::now();
    Supervisor supervisor(options, nodes ? &*nodes : nullptr);
    const int code = supervisor.run();
    merge_traces(supervisor.options(), started);
    return code;
  } catch (const gw::InvalidArgumentError& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage_text());
    return kUsageExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
