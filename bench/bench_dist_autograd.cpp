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
// Where python3-torch cannot run, the rows fall back to the figures PyTorch gave on this
// project's 2-core machine.
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "bench/harness.h"
#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/nn/remote_module.h"
#include "dist/optim/distributed_optimizer.h"
#include "dist/store/hash_store.h"
#include "examples/common/server_mlp.h"
#include "nn/functional.h"
#include "optim/sgd.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace dist = gw::dist;
namespace rpc = gw::rpc;
namespace dist_autograd = gw::dist_autograd;

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
double ps_train(dist::ModuleRRef model, int64_t steps) {
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
    dist_autograd::Context ctx;
    Tensor l = gw::nn::functional::cross_entropy(trainer->net.forward(trainer->x), trainer->y);
    dist_autograd::backward(ctx.id(), {l});
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
  std::string note() const { return out ? "tensorpipe over tcp" : gw::bench::kPublishedFigure; }
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
    o.store = std::make_shared<gw::dist::HashStore>();
    o.num_worker_threads = 8;
    std::vector<std::future<std::unique_ptr<rpc::Agent>>> starting;
    for (int r = 0; r < n; ++r)
      starting.push_back(std::async(std::launch::async, [r, n, o] {
        return std::make_unique<rpc::Agent>("worker" + std::to_string(r), r, n, o);
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

  if (report.wants("dist_autograd", "one rpc iteration")) {
    Tensor t1 = gw::rand({3, 3}).requires_grad_(), t2 = gw::rand({3, 3}).requires_grad_();
    Tensor t4 = gw::rand({3, 3}).requires_grad_();
    double t = gw::bench::seconds_per_call([&] {
      dist_autograd::Context ctx;
      Tensor t3 = rpc::rpc_sync("worker1", my_add, t1, t2);
      Tensor loss = (t3 * t4).sum();
      dist_autograd::backward(ctx.id(), {loss});
      gw::bench::do_not_optimize(dist_autograd::get_gradients(ctx.id()).size());
    });
    report.add({"dist_autograd", "one rpc iteration", t * 1e6, "us", "pytorch",
                torch.get("one_rpc_iter_us", 1900), torch.note()});
  }
  if (report.wants("dist_autograd", "spec end-to-end iteration")) {
    double t = gw::bench::seconds_per_call([&] {
      dist_autograd::Context ctx;
      auto rref1 = rpc::remote("worker1", random_tensor);
      auto rref2 = rpc::remote("worker1", random_tensor);
      Tensor loss = rref1.to_here() + rref2.to_here();
      dist_autograd::backward(ctx.id(), {loss.sum()});
      gw::dist::DistributedOptimizer opt(gw::optim::SGD::options(0.05), {rref1, rref2});
      opt.step(ctx.id());
    });
    report.add({"dist_autograd", "spec end-to-end iteration", t * 1e6, "us", "pytorch",
                torch.get("e2e_iter_us", 10000), torch.note()});
  }
  if (report.wants("dist_autograd", "parameter server, 2 trainers")) {
    gw::Generator gen(0);
    const dist::ModuleRRef model{
        std::shared_ptr<gw::nn::Module>(std::make_shared<gw::examples::ServerMlp>(gen))};
    auto run = [&](int64_t steps) {
      auto a = rpc::rpc_async("worker1", ps_train, model, steps);
      auto b = rpc::rpc_async("worker2", ps_train, model, steps);
      a.wait();
      b.wait();
    };
    run(kPsWarmup);
    auto start = std::chrono::steady_clock::now();
    run(kPsSteps);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.add({"dist_autograd", "parameter server, 2 trainers",
                2.0 * kPsSteps * kPsBatch / seconds, "samples/s", "pytorch",
                torch.get("ps_samples_per_s", 5700), torch.note()});
    std::lock_guard lock(g_trainers_mu);
    g_trainers.clear();
  }
  return 0;
}
