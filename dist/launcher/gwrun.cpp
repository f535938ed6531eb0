// gwrun, gradwire's torchrun: starts --nproc-per-node workers with the torch.distributed
// environment and a job key, forwards their output prefixed by rank, and stops them all if one
// fails (then, with --max-restarts, starts them all again).
#include <cstdio>
#include <exception>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "dist/launcher/guardian.h"
#include "dist/launcher/job_key_file.h"
#include "dist/launcher/node_rendezvous.h"
#include "dist/launcher/options.h"
#include "dist/launcher/supervisor.h"

namespace {

constexpr int kUsageExitCode = 2;  // what argparse-based torchrun uses for bad usage

}  // namespace

int main(int argc, char** argv) {
  using namespace gw::launcher;
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
    Supervisor supervisor(std::move(options), nodes ? &*nodes : nullptr);
    return supervisor.run();
  } catch (const gw::InvalidArgumentError& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage_text());
    return kUsageExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
