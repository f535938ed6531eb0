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
#include "dist/launcher/guardian.h"
#include "dist/launcher/job_key_file.h"
#include "dist/launcher/node_rendezvous.h"
#include "dist/launcher/options.h"
#include "dist/launcher/supervisor.h"

namespace {

constexpr int kUsageExitCode = 2;  // what argparse-based torchrun uses for bad usage

// With GW_TRACE=FILE, every worker wrote FILE.rank<R>.json (core/trace.h): this node's ranks'
// go into FILE, one timeline per rank.
void merge_traces(const gw::launcher::LaunchOptions& options) {
  const char* path = std::getenv("GW_TRACE");
  if (path == nullptr || *path == '\0') return;
  std::vector<std::string> parts;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    std::string part =
        std::string(path) + ".rank" + std::to_string(options.rank_of(local)) + ".json";
    if (std::filesystem::exists(part)) parts.push_back(std::move(part));
  }
  if (parts.empty()) return;
  try {
    gw::trace::merge(parts, path);
    std::fprintf(stderr,
                 "[gwrun] the trace of %zu rank(s) is in %s: open it at "
                 "https://ui.perfetto.dev\n",
                 parts.size(), path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[gwrun] could not merge the traces: %s\n", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gw::launcher;
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
    if (!options.rdzv_endpoint.empty()) {
      nodes.emplace(options);
    } else {
      options.master_port = resolve_master_port(options);
    }
    Supervisor supervisor(options, nodes ? &*nodes : nullptr);
    const int code = supervisor.run();
    merge_traces(supervisor.options());
    return code;
  } catch (const gw::InvalidArgumentError& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage_text());
    return kUsageExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
