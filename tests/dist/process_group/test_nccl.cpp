// The NCCL process group at world size 1 (one GPU): every collective on CUDA tensors, its
// errors, and DDP on it matching local training. Skips with a one-line reason without a CUDA
// device; the no-device behaviour itself is checked on every machine this suite builds on
// (those with NCCL).
#include <catch2/catch.hpp>

#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/process_group/init_process_group.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "store/hash_store.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/dist/process_group/collective_checks.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;

TEST_CASE("without a CUDA device the nccl group says why instead of crashing", "[nccl]") {
  std::string why;
  if (dist::nccl_available(&why)) GW_SKIP("a CUDA device is present");
  CHECK(!why.empty());
  auto store = std::make_shared<gw::store::HashStore>();
  CHECK_THROWS_WITH(dist::ProcessGroupNCCL(store, 0, 1), Catch::Contains("no CUDA device"));
}

TEST_CASE("nccl: every collective at world size 1 on CUDA tensors", "[nccl]") {
  GW_REQUIRE_CUDA_DEVICE();
  dist::ProcessGroupNCCL pg(std::make_shared<gw::store::HashStore>(), 0, 1);
  CHECK(pg.backend() == "nccl");
  dist::testing::Checks checks;
  dist::testing::check_every_collective(pg, checks);
  dist::testing::require_passed(checks);
}

TEST_CASE("nccl: bad arguments raise before anything runs", "[nccl][errors]") {
  GW_REQUIRE_CUDA_DEVICE();
  dist::ProcessGroupNCCL pg(std::make_shared<gw::store::HashStore>(), 0, 1);
  Tensor cpu = ones({4});
  CHECK_THROWS_WITH(pg.allreduce(cpu), Catch::Contains("takes tensors on cuda:") &&
                                           Catch::Contains("is on cpu"));
  Tensor ints = ones({4}, TensorOptions(kInt64).with_device(pg.device()));
  CHECK_THROWS_WITH(pg.allreduce(ints, {.op = dist::ReduceOp::AVG}),
                    Catch::Contains("AVG needs a floating point tensor"));
  Tensor strided = zeros({4, 4}, pg.device()).t();
  CHECK_THROWS_WITH(pg.broadcast(strided), Catch::Contains("must be contiguous"));
  CHECK_THROWS_WITH(pg.broadcast(ints, {.root = 1}), Catch::Contains("root 1 is outside [0, 1)"));
  pg.allreduce(ints)->wait();  // still usable
  CHECK(equal(ints.to(kCPU), ones({4}, kInt64)));
}

// At world size 1 the allreduce averages over one rank: this shows DDP's path through the
// NCCL group on CUDA tensors, not that gradients are summed across GPUs (one GPU here).
TEST_CASE("nccl: DDP at world size 1 matches local training", "[nccl][ddp]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto pg =
      std::make_shared<dist::ProcessGroupNCCL>(std::make_shared<gw::store::HashStore>(), 0, 1);
  const Device gpu = pg->device();
  auto make = [&] {
    Generator gen(3);
    auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 16, true, gen),
                                              std::make_shared<nn::ReLU>(),
                                              std::make_shared<nn::Linear>(16, 4, true, gen));
    m->to(gpu);
    return m;
  };
  auto net = make(), reference = make();
  ddp::DistributedDataParallel model(net, pg);
  optim::SGD opt(net->parameters(), optim::SGD::options(0.1));
  optim::SGD ref_opt(reference->parameters(), optim::SGD::options(0.1));
  Generator gen(5);
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({6, 8}, gen).to(gpu), y = randint(0, 4, {6}, gen).to(gpu);
    opt.zero_grad();
    ref_opt.zero_grad();
    nn::functional::cross_entropy(model.forward(x), y).backward();
    nn::functional::cross_entropy(reference->forward(x), y).backward();
    opt.step();
    ref_opt.step();
  }
  auto p = net->parameters(), q = reference->parameters();
  for (size_t i = 0; i < p.size(); ++i) CHECK(allclose(p[i].to(kCPU), q[i].to(kCPU), 1e-5, 1e-6));
}
