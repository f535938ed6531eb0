// One rank of test_fsdp's MPI case, started by `mpirun -np N fsdp_probe`: fully_shard on
// init_process_group("mpi") against single-process training (fsdp_checks.h), and at 4 ranks HSDP
// over a DeviceMesh (replicate, shard) of {2, 2}. Prints
// "rank R: C checks, F failed" and its failures, and exits 1 on any.
#include <iostream>

#include "dist/process_group/init_process_group.h"
#include "tests/fsdp/fsdp_checks.h"

int main() {
  using namespace gw;
  auto pg = dist::init_process_group("mpi");
  dist::testing::Checks checks;
  fsdp::testing::check_matches_single_process(pg, checks, {});
  fsdp::testing::check_matches_single_process(pg, checks,
                                              {.options = {}, .micro_batches = 2, .steps = 5});
  if (pg->size() == 4) {  // HSDP: 2 replicas of 2 shards, on the MPI group's subgroups
    const dist::DeviceMesh mesh = dist::init_device_mesh({2, 2}, {"replicate", "shard"});
    fsdp::testing::check_matches_single_process(
        mesh.group("shard"), checks, {.options = {.replicate_group = mesh.group("replicate")}});
    auto net = std::make_shared<fsdp::testing::Net>();
    fsdp::fully_shard(net->a, mesh);
    checks.expect(fsdp::fully_shard(net, mesh)->group() == mesh.group("shard"),
                  "fully_shard over a 2-D mesh shards over its second dimension");
    checks.expect_throws<InvalidArgumentError>(
        [&] {
          fsdp::fully_shard(std::make_shared<fsdp::testing::Net>(), mesh,
                            {.replicate_group = mesh.group("replicate")});
        },
        {"drop options.replicate_group"}, "a 2-D mesh beside options.replicate_group is refused");
  }
  std::cout << "rank " << pg->rank() << ": " << checks.count << " checks, "
            << checks.failures.size() << " failed\n";
  for (const auto& f : checks.failures) std::cout << "  " << f << "\n";
  return checks.failures.empty() ? 0 : 1;
}
