// Across hosts: RPC, allreduce and DDP between two processes in two network namespaces joined by
// a veth pair on a bridge (tests/netns_bed.h), each beside the same two processes on one host in
// the same run (where RPC and the Gloo group's allreduce go through shared memory, not
// loopback TCP):
//   - rpc_sync small call (min(1, 2)) and a 16 MiB tensor round trip,
//   - Gloo allreduce (SUM) of 4 MiB of float32, and of one float,
//   - DDP training of the Fashion-MNIST MLP 784-256-128-10, batch 32 per rank (random data);
// and where compression pays, on a link of 1 Gbit/s (tc's token bucket on each host's eth0):
//   - the DDP step of the 784-4096-2560-10 MLP (13.7M parameters), batch 32 per rank, through
//     PowerSGD (rank 4) and the bf16 hook, beside the allreduce hook over the same link, in
//     alternating rounds (the best of each).
// Needs root to build the namespaces; skips its rows elsewhere. The processes are this binary
// run as `bench_hosts --worker <kind> <rank> <master address> <port>`, with a job key.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/harness.h"
#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/powersgd.h"
#include "dist/process_group/init_process_group.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"
#include "tests/key_file.h"
#include "tests/netns_bed.h"

gw::Tensor echo(gw::Tensor t) { return t; }
GW_RPC_FUNCTION(echo);

namespace {

using gw::bench::Reporter;

// --- the workers ------------------------------------------------------------------------------

int rpc_worker(int rank, const std::string& init_method) {
  gw::rpc::RpcBackendOptions o;
  o.init_method = init_method;
  o.num_worker_threads = 2;
  gw::rpc::init_rpc("w" + std::to_string(rank), rank, 2, o);
  if (rank == 0) {
    const double small = gw::bench::seconds_per_call(
        [] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); });
    gw::Tensor x = gw::ones({16 << 18});
    const double big = gw::bench::seconds_per_call(
        [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); }, 0.2, 5);
    std::printf("{\"small_us\": %g, \"big_gbps\": %g}\n", small * 1e6,
                2.0 * x.nbytes() / big / 1e9);
  }
  gw::rpc::shutdown();
  return 0;
}

int allreduce_worker(int rank, const std::string& init_method) {
  auto pg = gw::dist::init_process_group("gloo", init_method, rank, 2);
  gw::Tensor big = gw::ones({1 << 20}), one = gw::ones({1});
  // The same number of collectives on both ranks (the harness's adaptive loops would differ):
  // the best of 5 rounds, as the harness does.
  auto best = [&](gw::Tensor& t, int calls) {
    double out = 1e30;
    for (int round = 0; round < 6; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) pg->allreduce(t)->wait();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) out = std::min(out, s / calls);  // round 0 warms up
    }
    return out;
  };
  const double t_big = best(big, 20), t_one = best(one, 500);
  // Both ranks measure; rank 0 reports.
  if (rank == 0)
    std::printf("{\"big_gbps\": %g, \"one_us\": %g}\n", big.nbytes() / t_big / 1e9, t_one * 1e6);
  pg->barrier()->wait();
  gw::dist::destroy_process_group();
  return 0;
}

int ddp_worker(int rank, const std::string& init_method) {
  constexpr int kBatch = 32, kSteps = 200;
  auto pg = gw::dist::init_process_group("gloo", init_method, rank, 2);
  gw::Generator gen(0);
  auto mlp = std::make_shared<gw::nn::Sequential>();
  mlp->push_back(std::make_shared<gw::nn::Linear>(784, 256, true, gen));
  mlp->push_back(std::make_shared<gw::nn::ReLU>());
  mlp->push_back(std::make_shared<gw::nn::Linear>(256, 128, true, gen));
  mlp->push_back(std::make_shared<gw::nn::ReLU>());
  mlp->push_back(std::make_shared<gw::nn::Linear>(128, 10, true, gen));
  gw::ddp::DistributedDataParallel model(mlp, pg);
  gw::optim::SGD opt(model.module()->parameters(), gw::optim::SGD::options(0.01));
  gw::Tensor x = gw::randn({kBatch, 784}, gen), y = gw::randint(0, 10, {kBatch}, gen);
  auto step = [&] {
    opt.zero_grad();
    gw::nn::functional::cross_entropy(model.forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 10; ++i) step();  // warm up
  pg->barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank == 0) std::printf("{\"samples_per_s\": %g}\n", 2.0 * kBatch * kSteps / s);
  pg->barrier()->wait();
  gw::dist::destroy_process_group();
  return 0;
}

// The 13.7M-parameter MLP's DDP step through each hook, in alternating rounds; rank 0 reports
// the best round of each, in ms.
int hooks_worker(int rank, const std::string& init_method) {
  constexpr int kBatch = 32, kRounds = 3, kSteps = 3;
  auto pg = gw::dist::init_process_group("gloo", init_method, rank, 2);
  struct Run {  // allreduce, bf16, PowerSGD
    std::shared_ptr<gw::nn::Sequential> model = std::make_shared<gw::nn::Sequential>();
    std::unique_ptr<gw::ddp::DistributedDataParallel> ddp;
    std::unique_ptr<gw::optim::SGD> opt;
    double best = 1e30;
  };
  std::vector<Run> runs(3);
  gw::Generator gen(0);
  const gw::Tensor x = gw::randn({kBatch, 784}, gen), y = gw::randint(0, 10, {kBatch}, gen);
  for (Run& run : runs) {
    gw::Generator weights(1);
    run.model->push_back(std::make_shared<gw::nn::Linear>(784, 4096, true, weights));
    run.model->push_back(std::make_shared<gw::nn::ReLU>());
    run.model->push_back(std::make_shared<gw::nn::Linear>(4096, 2560, true, weights));
    run.model->push_back(std::make_shared<gw::nn::ReLU>());
    run.model->push_back(std::make_shared<gw::nn::Linear>(2560, 10, true, weights));
    run.ddp = std::make_unique<gw::ddp::DistributedDataParallel>(run.model, pg);
    run.opt =
        std::make_unique<gw::optim::SGD>(run.model->parameters(), gw::optim::SGD::options(0.01));
  }
  runs[1].ddp->register_comm_hook(gw::ddp::hooks::bf16_compress());
  runs[2].ddp->register_comm_hook(gw::ddp::hooks::powersgd(std::make_shared<gw::ddp::PowerSGDState>(
      gw::ddp::PowerSGDOptions{.matrix_approximation_rank = 4, .start_powerSGD_iter = 2})));
  auto step = [&](Run& run) {
    run.opt->zero_grad();
    gw::nn::functional::cross_entropy(run.ddp->forward(x), y).backward();
    run.opt->step();
  };
  for (Run& run : runs)
    for (int i = 0; i < 3; ++i) step(run);  // PowerSGD compresses from the 3rd
  for (int round = 0; round < kRounds; ++round)
    for (Run& run : runs) {
      pg->barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) step(run);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      run.best = std::min(run.best, s / kSteps);
    }
  if (rank == 0)
    std::printf("{\"allreduce_ms\": %g, \"bf16_ms\": %g, \"powersgd_ms\": %g}\n",
                runs[0].best * 1e3, runs[1].best * 1e3, runs[2].best * 1e3);
  pg->barrier()->wait();
  gw::dist::destroy_process_group();
  return 0;
}

int worker(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: bench_hosts --worker rpc|allreduce|ddp|hooks RANK MASTER PORT\n");
    return 2;
  }
  const std::string kind = argv[2], master = argv[4], port = argv[5];
  const int rank = std::atoi(argv[3]);
  const bool v6 = master.find(':') != std::string::npos;
  const std::string init = "tcp://" + (v6 ? "[" + master + "]" : master) + ":" + port;
  try {
    if (kind == "rpc") return rpc_worker(rank, init);
    if (kind == "allreduce") return allreduce_worker(rank, init);
    if (kind == "ddp") return ddp_worker(rank, init);
    if (kind == "hooks") return hooks_worker(rank, init);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_hosts worker %s %d: %s\n", kind.c_str(), rank, e.what());
    return 1;
  }
  return 2;
}

// --- the driver -------------------------------------------------------------------------------

// Rank 0's report of `kind`, its rank 0 on `ns0` and rank 1 on `ns1`, meeting at `master`.
std::string pair(const std::string& kind, const std::string& ns0, const std::string& ns1,
                 const std::string& master) {
  const std::string self = gw::bench::executable_dir() + "/bench_hosts";
  auto rank = [&](const std::string& ns, int r) {
    return "ip netns exec " + ns + " " + self + " --worker " + kind + " " + std::to_string(r) +
           " " + master + " 29500";
  };
  return gw::bench::run_capture(rank(ns1, 1) + " >/dev/null 2>&1 & " + rank(ns0, 0) +
                                "; status=$?; wait; exit $status")
      .value_or("");
}

struct Case {
  const char* kind;
  const char* name;
  const char* key;
  const char* unit;
  double scale = 1;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--worker") == 0) return worker(argc, argv);
  Reporter report(argc, argv);
  const Case cases[] = {
      {"rpc", "rpc_sync small, two hosts (veth)", "small_us", "us"},
      {"rpc", "tensor round trip 16 MiB, two hosts (veth)", "big_gbps", "GB/s"},
      {"allreduce", "gloo allreduce 4 MiB float32, two hosts (veth)", "big_gbps", "GB/s"},
      {"allreduce", "gloo allreduce 1 float, two hosts (veth)", "one_us", "us"},
      {"ddp", "DDP training, Fashion-MNIST MLP, two hosts (veth)", "samples_per_s", "samples/s"},
  };
  if (const std::string why = gw::test::NetnsBed::unavailable(); !why.empty()) {
    for (const auto& c : cases) report.skip("hosts", c.name, why);
    return 0;
  }
  gw::test::NetnsBed bed(2);
  const gw::test::KeyFile key(/*export_env=*/true);  // as every node of a real job shares one
  for (const char* kind : {"rpc", "allreduce", "ddp"}) {
    bool wanted = false;
    for (const auto& c : cases)
      wanted = wanted || (c.kind == std::string(kind) && report.wants("hosts", c.name));
    if (!wanted) continue;
    const std::string veth = pair(kind, bed.ns(0), bed.ns(1), bed.ipv4(0));
    const std::string lo = pair(kind, bed.ns(0), bed.ns(0), "127.0.0.1");
    for (const auto& c : cases) {
      if (c.kind != std::string(kind) || !report.wants("hosts", c.name)) continue;
      const auto v = gw::bench::json_number(veth, c.key), l = gw::bench::json_number(lo, c.key);
      if (!v || !l) {
        report.skip("hosts", c.name, "a worker failed: " + (v ? lo : veth));
        continue;
      }
      report.add({"hosts", c.name, *v, c.unit, "the same two processes on one host, same run", *l});
    }
  }
  // Compression where the link is the bottleneck: both hosts' cables limited to 1 Gbit/s.
  const char* kPowerSGD = "13.7M MLP DDP step, PowerSGD rank 4, two hosts at 1 Gbit/s";
  const char* kBf16 = "13.7M MLP DDP step, bf16 hook, two hosts at 1 Gbit/s";
  if (report.wants("hosts", kPowerSGD) || report.wants("hosts", kBf16)) {
    bool limited = true;
    for (int host = 0; host < 2; ++host)
      limited = limited && std::system(("ip netns exec " + bed.ns(host) +
                                        " tc qdisc replace dev eth0 root tbf rate 1gbit burst 1mb "
                                        "latency 100ms")
                                           .c_str()) == 0;
    const std::string out = limited ? pair("hooks", bed.ns(0), bed.ns(1), bed.ipv4(0)) : "";
    const auto all = gw::bench::json_number(out, "allreduce_ms");
    for (const auto& [name, key] :
         {std::pair{kPowerSGD, "powersgd_ms"}, std::pair{kBf16, "bf16_ms"}}) {
      const auto v = gw::bench::json_number(out, key);
      if (!limited)
        report.skip("hosts", name, "tc could not limit the link (iproute2's tc, sch_tbf)");
      else if (!v || !all)
        report.skip("hosts", name, "a worker failed: " + out);
      else
        report.add({"hosts", name, *v, "ms", "allreduce hook over the same link, same run", *all});
    }
  }
  return 0;
}
