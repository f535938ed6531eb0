#include "tests/rpc/test_functions.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "core/ops.h"

namespace gw::rpc::testing {

namespace {
std::mutex g_mu;
std::condition_variable g_cv;
bool g_released = false;
}  // namespace

Tensor my_add(Tensor a, Tensor b) { return a + b; }

Tensor fail_with(std::string message) { throw InvalidArgumentError(message); }

int64_t block_until_released() {
  std::unique_lock lock(g_mu);
  g_cv.wait(lock, [] { return g_released; });
  return 42;
}

void release_blocked() {
  {
    std::lock_guard lock(g_mu);
    g_released = true;
  }
  g_cv.notify_all();
}

void arm_blocked() {
  std::lock_guard lock(g_mu);
  g_released = false;
}

Future<Tensor> async_add_chained(std::string to, Tensor x, int64_t y, int64_t z) {
  return rpc_async<Tensor>(to, "add", x, y).then([z](Future<Tensor>& f) { return f.wait() + z; });
}

int64_t crash() { std::_Exit(3); }

std::string whoami() { return current_agent().get_worker_info().name; }

GW_RPC_FUNCTION(my_add);
GW_RPC_FUNCTION(fail_with);
GW_RPC_FUNCTION(block_until_released);
GW_RPC_FUNCTION(async_add_chained);
GW_RPC_FUNCTION(crash);
GW_RPC_FUNCTION(whoami);

}  // namespace gw::rpc::testing
