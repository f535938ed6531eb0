// The examples of the RPC spec (torch.distributed.rpc), in C++. Run with three workers:
//
//   build/tools/gwrun/gwrun --nproc-per-node 3 build/examples/rpc_basics
//
// or under srun -n 3, mpirun -np 3, a PyTorchJob of three: init_rpc("worker{rank}") takes the
// rank, world size and master from whichever launcher started it. worker0 drives, the others
// serve until everyone reaches shutdown(). A failure is one line and exit code 1.
#include <cstdlib>
#include <iostream>

#include "core/ops.h"
#include "rpc/rpc.h"

using gw::Tensor;
namespace rpc = gw::rpc;

// PyTorch's @rpc.functions.async_execution example (pytorch.org/docs/stable/rpc.html): runs on
// worker1, returns at once with a future; the add on `to` proceeds meanwhile and its result plus z
// answers worker0.
gw::Future<Tensor> async_add_chained(std::string to, Tensor x, int64_t y, int64_t z) {
  return rpc::rpc_async<Tensor>(to, "add", x, y).then([z](gw::Future<Tensor>& fut) {
    return fut.wait() + z;
  });
}
GW_RPC_FUNCTION(async_add_chained);

// The AsyncExecutionClass of the same page: its method runs on the RRef's owner with async
// execution.
struct AsyncExecutionClass {
  gw::Future<Tensor> async_add(std::string to, Tensor x, int64_t y, int64_t z) {
    return async_add_chained(std::move(to), std::move(x), y, z);
  }
};
static const bool kRegistered = [] {
  rpc::functions()
      .add_class<AsyncExecutionClass>("AsyncExecutionClass")
      .add_method("static_async_add", &AsyncExecutionClass::async_add);
  rpc::functions().add_constructor<AsyncExecutionClass>("AsyncExecutionClass");
  return true;
}();

// worker0's part: the examples of pytorch.org/docs/stable/rpc.html, each printed beside PyTorch's
// output.
static void drive();

int main() {
  try {
    rpc::init_rpc("worker{rank}");
    const rpc::WorkerInfo self = rpc::get_worker_info();
    if (rpc::get_worker_infos().size() < 3) {
      std::cerr << "rpc_basics needs 3 workers (gwrun --nproc-per-node 3)\n";
      rpc::shutdown(false);
      return 2;
    }
    if (self.id == 0) drive();
    rpc::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rpc_basics: " << e.what() << "\n";
    return 1;
  }
}

static void drive() {
  // rpc_sync: ret = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
  Tensor ret = rpc::rpc_sync<Tensor>("worker1", "add", gw::ones({2}), 3);
  std::cout << "rpc_sync add:        " << ret << "   # tensor([4., 4.])\n";

  // rpc_async: two futures, then fut1.wait() + fut2.wait()
  auto fut1 = rpc::rpc_async<Tensor>("worker1", "add", gw::ones({2}), 3);
  auto fut2 = rpc::rpc_async<int64_t>("worker1", "min", 1, 2);
  Tensor result = fut1.wait() + fut2.wait();
  std::cout << "rpc_async add + min: " << result << "   # tensor([5., 5.])\n";

  // async_execution chained across three workers
  ret = rpc::rpc_sync("worker1", async_add_chained, std::string("worker2"), gw::ones({2}), 1, 1);
  std::cout << "async_add_chained:   " << ret << "   # tensor([3., 3.])\n";

  // remote + to_here: the values live on worker1 until fetched
  auto rref1 = rpc::remote<Tensor>("worker1", "add", gw::ones({2}), 3);
  auto rref2 = rpc::remote<Tensor>("worker1", "add", gw::ones({2}), 1);
  Tensor x = rref1.to_here() + rref2.to_here();
  std::cout << "remote + to_here:    " << x << "   # tensor([6., 6.])\n";

  // RRef helpers: run a method of the owner's object on the owner
  auto rref = rpc::remote<std::shared_ptr<AsyncExecutionClass>>("worker1", "AsyncExecutionClass");
  ret = rref.rpc_sync(&AsyncExecutionClass::async_add, std::string("worker2"), gw::ones({2}), 1, 2);
  std::cout << "rref.rpc_sync():     " << ret << "   # tensor([4., 4.])\n";
  ret = rref.rpc_async<Tensor>("static_async_add", std::string("worker2"), gw::ones({2}), 1, 2)
            .wait();
  std::cout << "rref.rpc_async():    " << ret << "   # tensor([4., 4.])\n";
  ret = rref.remote<Tensor>("static_async_add", std::string("worker2"), gw::ones({2}), 1, 2)
            .to_here();
  std::cout << "rref.remote():       " << ret << "   # tensor([4., 4.])\n";

  // WorkerInfo avoids passing the name on every call.
  rpc::WorkerInfo w2 = rpc::get_worker_info("worker2");
  std::cout << "get_worker_info:     WorkerInfo(name=" << w2.name << ", id=" << w2.id << ")\n";
}
