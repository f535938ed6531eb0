// Distributed autograd benchmarks: three agents in this process (worker0 drives, worker1 and
// worker2 serve) talking over 127.0.0.1, each case beside PyTorch 1.13 doing the same work with
// three processes in the same run (torch_anchor_dist_autograd.py, TensorPipe over TCP):
//   - one iteration of the design note's first example: in a fresh context, rpc_sync of
//     my_add(t1, t2) on worker1, t3 * t4, backward from the sum, get_gradients;
//   - one iteration of the note's end-to-end example: two remote() random tensors on worker1,
//     to_here both, backward, a new DistributedOptimizer (SGD, lr 0.05), one step;
//   - parameter-server training throughput: worker0 holds the MLP 784-256-128-10 and worker1
//     and worker2 each train it for 150 steps at once (forward over RPC, cross entropy, dist
//     backward, DistributedOptimizer SGD lr 0.01 step) on a fixed random batch of 64.
// Each case runs again in SMART mode, beside FAST mode in the same run (the "SMART mode" rows,
// whose anchor is gradwire's FAST mode; their note gives the ratio to PyTorch's FAST mode).
// Where python3-torch cannot run, the rows fall back to the figures PyTorch gave on this
// project's 2-core machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "bench/harness.h"
#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/init_rpc.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "examples/common/server_mlp.h"
#include "nn/functional.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"

using gw::Tensor;
namespace dist = gw::dist;
namespace rpc = gw::rpc;
namespace dist_autograd = gw::dist::autograd;

constexpr int64_t kPsBatch = 64, kPsSteps = 150, kPsWarmup = 5;

Tensor my_add(Tensor a, Tensor b) { return a + b; }
Tensor random_tensor() { return gw::rand({3, 3}).requires_grad_(); }
GW_RPC_FUNCTION(my_add);
GW_RPC_FUNCTION(random_tensor);

// The trainers of the parameter-server case, by worker id: each one's optimizer and batch are
// made on its first call (the warm-up) and kept, so that only steps are timed. Cleared while
// the agents still run, since they hold RRefs.
struct Trainer {
  dist::RemoteModule net;
  gw::dist::DistributedOptimizer opt;
  Tensor x, y;
};
std::mutex g_trainers_mu;
std::map<int, std::unique_ptr<Trainer>> g_trainers;

// `steps` steps of one trainer on its own fixed batch.
double ps_train(dist::ModuleRRef model, int64_t steps, bool smart) {
  const dist::autograd::BackwardOptions options{.mode = smart ? dist::autograd::Mode::kSmart
                                                              : dist::autograd::Mode::kFast};
  const int me = rpc::get_worker_info().id;
  Trainer* trainer;
  {
    std::lock_guard lock(g_trainers_mu);
    auto& slot = g_trainers[me];
    if (!slot) {
      gw::Generator gen(static_cast<uint64_t>(me));
      dist::RemoteModule net(model);
      auto params = net.remote_parameters();
      slot = std::make_unique<Trainer>(Trainer{
          std::move(net), gw::dist::DistributedOptimizer(gw::optim::SGD::options(0.01), params),
          gw::randn({kPsBatch, 784}, gen), gw::randint(0, 10, {kPsBatch}, gen)});
    }
    trainer = slot.get();
  }
  double loss = 0;
  for (int64_t s = 0; s < steps; ++s) {
    dist::autograd::Context ctx;
    Tensor l = gw::nn::functional::cross_entropy(trainer->net.forward(trainer->x), trainer->y);
    dist::autograd::backward(ctx.id(), {l}, options);
    trainer->opt.step(ctx.id());
    loss = l.item<double>();
  }
  return loss;
}
GW_RPC_FUNCTION(ps_train);

namespace {

struct TorchAnchor {
  std::optional<std::string> out;
  double get(const std::string& key, double published) const {
    auto v = out ? gw::bench::json_number(*out, key) : std::nullopt;
    return v ? *v : published;
  }
  // `multiplies`: the case multiplies matrices, so the note names each side's BLAS.
  std::string note(bool multiplies) const {
    if (!out) return gw::bench::kPublishedFigure;
    return multiplies ? "tensorpipe over tcp; " + gw::bench::blas_note(*out)
                      : "tensorpipe over tcp";
  }
};

TorchAnchor run_torch_anchor() {
  std::string script = gw::bench::executable_dir() + "/torch_anchor_dist_autograd.py";
  TorchAnchor a;
  a.out = gw::bench::run_capture("timeout -k 5 180 /usr/bin/python3 " + script + " 2>/dev/null");
  if (a.out && a.out->find("\"one_rpc_iter_us\"") == std::string::npos) a.out.reset();
  return a;
}

struct Group {
  std::vector<std::unique_ptr<rpc::Agent>> agents;
  explicit Group(int n) {
    rpc::RpcBackendOptions o;
    o.store = std::make_shared<gw::store::HashStore>();
    o.num_worker_threads = 8;
    std::vector<std::future<std::unique_ptr<rpc::Agent>>> starting;
    for (int r = 0; r < n; ++r)
      starting.push_back(std::async(std::launch::async, [r, n, o] {
        return std::make_unique<rpc::Agent>("worker" + std::to_string(r), r, n, dist::with_dist(o));
      }));
    for (auto& s : starting) agents.push_back(s.get());
  }
  ~Group() {
    std::vector<std::future<void>> done;
    for (auto& a : agents) done.push_back(std::async(std::launch::async, [&a] { a->shutdown(); }));
    for (auto& d : done) d.get();
  }
};

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  const bool any = report.wants("dist_autograd", "one rpc iteration") ||
                   report.wants("dist_autograd", "spec end-to-end iteration") ||
                   report.wants("dist_autograd", "parameter server, 2 trainers");
  if (!any) return 0;
  // PyTorch first, alone on the machine; then gradwire.
  const TorchAnchor torch = run_torch_anchor();
  Group g(3);
  rpc::Agent::Use use(*g.agents[0]);

  // The FAST row against PyTorch, then the SMART row against that FAST figure.
  auto add_rows = [&](const std::string& name, double fast, double smart, const char* unit,
                      const std::string& torch_key, double torch_published,
                      bool multiplies = false) {
    const double anchor = torch.get(torch_key, torch_published);
    report.add({"dist_autograd", name, fast, unit, "pytorch", anchor, torch.note(multiplies)});
    const bool per_second = std::string(unit) == "samples/s";
    const double vs_torch = per_second ? smart / anchor : anchor / smart;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.1fx", vs_torch);
    report.add({"dist_autograd", name + ", SMART mode", smart, unit, "gradwire FAST mode", fast,
                std::string(ratio) + " pytorch's FAST mode (" + torch.note(multiplies) + ")"});
  };
  auto mode_of = [](bool smart) {
    return dist::autograd::BackwardOptions{.mode = smart ? dist::autograd::Mode::kSmart
                                                         : dist::autograd::Mode::kFast};
  };

  if (report.wants("dist_autograd", "one rpc iteration")) {
    Tensor t1 = gw::rand({3, 3}).requires_grad_(), t2 = gw::rand({3, 3}).requires_grad_();
    Tensor t4 = gw::rand({3, 3}).requires_grad_();
    auto iteration = [&](bool smart) {
      dist::autograd::Context ctx;
      Tensor t3 = rpc::rpc_sync("worker1", my_add, t1, t2);
      Tensor loss = (t3 * t4).sum();
      dist::autograd::backward(ctx.id(), {loss}, mode_of(smart));
      gw::bench::do_not_optimize(dist::autograd::get_gradients(ctx.id()).size());
    };
    auto [smart, fast] =
        gw::bench::seconds_per_call_pair([&] { iteration(true); }, [&] { iteration(false); });
    add_rows("one rpc iteration", fast * 1e6, smart * 1e6, "us", "one_rpc_iter_us", 1900);
  }
  if (report.wants("dist_autograd", "spec end-to-end iteration")) {
    auto iteration = [&](bool smart) {
      dist::autograd::Context ctx;
      auto rref1 = rpc::remote("worker1", random_tensor);
      auto rref2 = rpc::remote("worker1", random_tensor);
      Tensor loss = rref1.to_here() + rref2.to_here();
      dist::autograd::backward(ctx.id(), {loss.sum()}, mode_of(smart));
      gw::dist::DistributedOptimizer opt(gw::optim::SGD::options(0.05), {rref1, rref2});
      opt.step(ctx.id());
    };
    auto [smart, fast] =
        gw::bench::seconds_per_call_pair([&] { iteration(true); }, [&] { iteration(false); });
    add_rows("spec end-to-end iteration", fast * 1e6, smart * 1e6, "us", "e2e_iter_us", 10000);
  }
  if (report.wants("dist_autograd", "parameter server, 2 trainers")) {
    gw::Generator gen(0);
    const dist::ModuleRRef model{
        std::shared_ptr<gw::nn::Module>(std::make_shared<gw::examples::ServerMlp>(gen))};
    // Samples per second of both trainers training at once.
    auto run = [&](int64_t steps, bool smart) {
      auto start = std::chrono::steady_clock::now();
      auto a = rpc::rpc_async("worker1", ps_train, model, steps, smart);
      auto b = rpc::rpc_async("worker2", ps_train, model, steps, smart);
      a.wait();
      b.wait();
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return 2.0 * static_cast<double>(steps * kPsBatch) / seconds;
    };
    run(kPsWarmup, false);
    double fast = 0, smart = 0;
    for (int round = 0; round < 2; ++round) {  // alternating, best of two each
      fast = std::max(fast, run(kPsSteps, false));
      smart = std::max(smart, run(kPsSteps, true));
    }
    add_rows("parameter server, 2 trainers", fast, smart, "samples/s", "ps_samples_per_s", 5700,
             /*multiplies=*/true);
    std::lock_guard lock(g_trainers_mu);
    g_trainers.clear();
  }
  return 0;
}
