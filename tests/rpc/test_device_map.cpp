// CUDA tensors through RPC (RpcBackendOptions::device_maps): validation everywhere, and with a
// CUDA device, tensors placed on the mapped device on the callee and back on the caller's.
#include <catch2/catch.hpp>

#include "core/ops.h"
#include "core/storage.h"
#include "rpc/api.h"
#include "tests/rpc/group.h"
#include "tests/rpc/test_functions.h"
#ifdef GW_HAVE_CUDA
#include "tests/cuda/cuda_test_util.h"
#endif

using namespace gw;
using namespace gw::rpc;
using gw::rpc::testing::Group;
using gw::rpc::testing::my_add;

TEST_CASE("set_device_map keeps maps invertible", "[rpc][cuda]") {
  RpcBackendOptions o;
  o.set_device_map("worker1", {{0, 1}});
  o.set_device_map("worker1", {{1, 2}});  // incrementally, as in PyTorch's example
  CHECK(o.device_maps.at("worker1") == std::map<int, int>{{0, 1}, {1, 2}});
  CHECK_THROWS_WITH(
      o.set_device_map("worker1", {{3, 1}}),
      Catch::Contains("cuda:0 and cuda:3 both on cuda:1") && Catch::Contains("invertible"));
  CHECK_THROWS_WITH(o.set_device_map("worker2", {{-1, 0}}), Catch::Contains("-1 -> 0"));
  // Indices past the device limit are refused here, before the wire's 16-bit field wraps them.
  CHECK_THROWS_WITH(o.set_device_map("worker2", {{0, 70000}}),
                    Catch::Contains("0 -> 70000") && Catch::Contains("[0, 64)"));
}

TEST_CASE("a CUDA tensor without a device map toward the callee is refused", "[rpc][cuda]") {
  Group g(2);
  Agent::Use use(g[0]);
  // Host memory labelled as cuda:0: the send must be refused before anything reads it.
  std::vector<float> bytes(2, 1.f);
  Tensor fake =
      Tensor::make(Storage::wrap(bytes.data(), 8, cuda_device(0), {}), {2}, {1}, 0, kFloat32);
  CHECK_THROWS_WITH(rpc_sync(1, my_add, fake, fake),
                    Catch::Contains("cuda:0") && Catch::Contains("set_device_map"));
  // The agent is unharmed.
  CHECK(rpc_sync(1, my_add, ones({2}), ones({2})).sum().item<float>() == 4);
}

#ifdef GW_HAVE_CUDA
TEST_CASE("CUDA tensors go to the mapped device and come back on the inverse map", "[rpc][cuda]") {
  GW_REQUIRE_CUDA_DEVICE();
  RpcBackendOptions o = Group::small_options();
  // With one GPU the map can only be cuda:0 -> cuda:0, so this cannot tell the inverse map
  // from the forward one; it shows that a mapped CUDA tensor crosses and comes back on a GPU.
  o.set_device_map("worker1", {{0, 0}});
  Group g(2, o);
  Agent::Use use(g[0]);
  Tensor x = ones({2}, cuda_device(0));
  Tensor r = rpc_sync(1, my_add, x, x);
  CHECK(r.device() == cuda_device(0));
  CHECK(r.to(kCPU).to_vector<float>() == std::vector<float>{2.f, 2.f});
  // CPU tensors stay on the CPU, beside CUDA ones.
  CHECK(rpc_sync(1, my_add, ones({2}), ones({2})).device().is_cpu());
}
#endif
