// The seeds' way: a GPT's stages as RemoteModules on two workers, driven over RPC by a third
// with distributed autograd (agents as threads of this process); the gradients are the whole
// model's, and a DistributedOptimizer steps the stages as it would the whole model.
#include <catch2/catch.hpp>

#include "dist/autograd/dist_autograd.h"
#include "dist/optim/distributed_optimizer.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "pipeline/remote.h"
#include "tests/dist/autograd/dist_group.h"
#include "tests/pipeline/tiny_gpt.h"

using namespace gw;

namespace {

constexpr int64_t kRemoteVocab = 13, kRemoteLength = 6;

std::shared_ptr<nn::GPT> remote_test_gpt() {
  return pipeline_test::tiny_gpt(kRemoteVocab, kRemoteLength, 2, 8);
}

// On a stage's worker: stage s of 2 of the same GPT; and a parameter's gradient in a context.
std::shared_ptr<nn::Module> remote_gpt_stage(int64_t s) {
  return remote_test_gpt()->stage(static_cast<int>(s), 2);
}
Tensor remote_grad_of(int64_t context_id, rpc::RRef<Tensor> p) {
  return dist::autograd::get_gradients(static_cast<uint64_t>(context_id)).at(p.local_value());
}
const bool kRemoteRegistered = [] {
  rpc::functions().add("test_gpt_stage", &remote_gpt_stage);
  rpc::functions().add("test_remote_grad_of", &remote_grad_of);
  pipeline::register_remote_stages();
  return true;
}();

Tensor remote_loss(const Tensor& logits, const Tensor& targets) {
  return nn::functional::cross_entropy(logits.reshape({-1, kRemoteVocab}), targets.reshape({-1}));
}

}  // namespace

TEST_CASE(
    "RemotePipeline: a GPT's two stages on two workers, 1 and 4 micro-batches: float64 "
    "gradients equal the whole model's, and SGD steps the same",
    "[pipeline][rpc]") {
  REQUIRE(kRemoteRegistered);
  dist::testing::DistGroup g(3);
  rpc::Agent::Use use(g[0]);
  Generator gen(3);
  const Tensor t = randint(0, kRemoteVocab, {8, kRemoteLength + 1}, gen);
  const Tensor x = t.narrow(1, 0, kRemoteLength).contiguous(),
               y = t.narrow(1, 1, kRemoteLength).contiguous();
  for (int m : {1, 4}) {
    INFO(m << " micro-batches");
    pipeline::RemotePipeline pipe({dist::RemoteModule("worker1", "test_gpt_stage", int64_t{0}),
                                   dist::RemoteModule("worker2", "test_gpt_stage", int64_t{1})},
                                  m);
    auto reference = remote_test_gpt();
    optim::SGD local_opt(reference->parameters(), optim::SGD::options(0.5));
    dist::DistributedOptimizer opt(optim::SGD::options(0.5), pipe.remote_parameters());
    for (int step = 0; step < 2; ++step) {
      dist::autograd::Context ctx;
      const Tensor loss = remote_loss(pipe.forward(x), y);
      dist::autograd::backward(ctx.id(), {loss});
      local_opt.zero_grad();
      const Tensor want = remote_loss((*reference)(x), y);
      want.backward();
      CHECK(std::abs(loss.item<double>() - want.item<double>()) < 1e-12);
      // Stage by stage, the gradients on their owners against the whole model's.
      size_t checked = 0;
      for (int s = 0; s < 2; ++s) {
        const auto remote = pipe.stages()[static_cast<size_t>(s)].remote_parameters();
        const auto local = reference->stage(s, 2)->parameters();
        REQUIRE(remote.size() == local.size());
        for (size_t i = 0; i < remote.size(); ++i) {
          const Tensor got = rpc::rpc_sync(remote[i].owner_name(), remote_grad_of,
                                           static_cast<int64_t>(ctx.id()), remote[i]);
          CHECK(allclose(got, local[i].grad(), 1e-12, 1e-14));
          ++checked;
        }
      }
      CHECK(checked == reference->parameters().size());
      opt.step(ctx.id());
      local_opt.step();
    }
    const auto params = pipe.remote_parameters();
    const auto local = reference->stage(0, 2)->parameters();
    CHECK(allclose(params[0].to_here(), local[0], 1e-12, 1e-14));
  }
  pipeline::RemotePipeline pipe({dist::RemoteModule("worker1", "test_gpt_stage", int64_t{0})}, 3);
  CHECK_THROWS_WITH(pipe.forward(x), Catch::Contains("[RemotePipeline] the input must split") &&
                                         Catch::Contains("3 micro-batches") &&
                                         Catch::Contains("(8,6)"));
  CHECK_THROWS_WITH(pipe.forward(x.narrow(0, 0, 0)),
                    Catch::Contains("3 micro-batches of one size") && Catch::Contains("(0,6)"));
  CHECK_THROWS_WITH(pipeline::RemotePipeline({}, 2), Catch::Contains("at least one stage"));
}
