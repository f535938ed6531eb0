// CUDA tensors through RPC (RpcBackendOptions::device_maps): validation everywhere, and with a
// CUDA device, tensors placed on the mapped device on the callee and back on the caller's:
// through host memory within a process, by IPC handle between processes of one host.
#include <catch2/catch.hpp>

#include "core/ipc.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/storage.h"
#include "rpc/api.h"
#include "rpc/rref.h"
#include "store/tcp_store.h"
#include "tests/process_util.h"
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
  const uint64_t shared = cuda_ipc_stats().shared;
  Tensor r = rpc_sync(1, my_add, x, x);
  CHECK(r.device() == cuda_device(0));
  CHECK(r.to(kCPU).to_vector<float>() == std::vector<float>{2.f, 2.f});
  // Within one process there is no IPC: the bytes went through host memory.
  CHECK(cuda_ipc_stats().shared == shared);
  // CPU tensors stay on the CPU, beside CUDA ones.
  CHECK(rpc_sync(1, my_add, ones({2}), ones({2})).device().is_cpu());
}

TEST_CASE("between processes of one host CUDA tensors go by IPC handle, and are copies",
          "[rpc][cuda][process]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto store = std::make_shared<store::TCPStore>("127.0.0.1", 0, -1, true);
  gw::test::PeerProcesses peers(GW_RPC_PEER, 2, store->port());
  RpcBackendOptions o;
  o.store = store;
  o.num_worker_threads = 4;
  o.set_device_map("worker1", {{0, 0}});
  Agent agent("worker0", 0, 2, o);
  Agent::Use use(agent);
  // Frames go by IPC handle once shared memory is set up, which takes the first round trip: the
  // frames sent before its answer cannot know yet that the peer is on this host.
  CHECK(rpc_sync("worker1", my_add, ones({1}), ones({1})).item<float>() == 2.f);
  const CudaIpcStats before = cuda_ipc_stats();
  Generator gen(5);
  Tensor host = randn({600, 37}, gen);
  Tensor x = host.to(cuda_device(0));
  // Views: rows 1.. and 2.. start inside x's storage, and x.t() is not contiguous.
  Tensor a = x.narrow(0, 1, 500), b = x.narrow(0, 2, 500);
  Tensor sum = rpc_sync("worker1", my_add, a, b);
  CHECK(sum.device() == cuda_device(0));
  CHECK(gw::equal(sum.to(kCPU), host.narrow(0, 1, 500) + host.narrow(0, 2, 500)));
  Tensor t = rpc_sync<Tensor>("worker1", "clone", x.t());
  CHECK(gw::equal(t.to(kCPU), host.t()));
  const CudaIpcStats after = cuda_ipc_stats();
  CHECK(after.shared == before.shared + 3);      // a, b, x.t()
  CHECK(after.imported == before.imported + 2);  // both results
  // A call's handler runs once its arguments are copied, and their lease is released first, on
  // the connection its answer takes.
  CHECK(after.leases_held == before.leases_held);
  // An RRef's value comes back the same way.
  auto rref = remote("worker1", my_add, a, a);
  CHECK(gw::equal(rref.to_here().to(kCPU), host.narrow(0, 1, 500) * 2));
  CHECK(cuda_ipc_stats().imported == after.imported + 1);
  // What was sent is a snapshot: writing x at once does not change what the peer gets.
  auto echoed = rpc_async<Tensor>("worker1", "clone", x);
  x.zero_();
  CHECK(gw::equal(echoed.wait().to(kCPU), host));
  // The results are this process's own copies: the write left them as they were.
  CHECK(gw::equal(t.to(kCPU), host.t()));
  // A call that fails still releases what it shared (whether its answer or the release comes
  // first depends on where it fails: a few more calls let the release arrive).
  CHECK_THROWS_WITH(rpc_sync<Tensor>("worker1", "no_such_function", x), Catch::Contains("no_such"));
  for (int i = 0; i < 100 && cuda_ipc_stats().leases_held != before.leases_held; ++i)
    rpc_sync("worker1", my_add, ones({1}), ones({1}));
  CHECK(cuda_ipc_stats().leases_held == before.leases_held);
  // The peer's memory stays mapped here, for the next tensors it shares, until the connection
  // closes: then nothing of it is kept.
  CHECK(cuda_ipc_stats().handles_mapped > before.handles_mapped);
  agent.shutdown();
  CHECK(cuda_ipc_stats().handles_mapped == before.handles_mapped);
  CHECK(peers.wait() == std::vector<int>{0});
}
#endif
