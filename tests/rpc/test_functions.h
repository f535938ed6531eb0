// Functions the RPC tests call remotely. They are registered on every worker because the test
// binary and the peer-process binary (rpc_peer) both link test_functions.cpp.
#pragma once

#include "rpc/rpc.h"

namespace gw::rpc::testing {

Tensor my_add(Tensor a, Tensor b);
// Throws InvalidArgumentError with `message`.
Tensor fail_with(std::string message);
// Blocks until release_blocked() is called in this process; arm_blocked() re-arms it.
int64_t block_until_released();
void release_blocked();
void arm_blocked();
// The spec's async_add_chained: runs add(x, y) on `to` with async execution, then adds z.
Future<Tensor> async_add_chained(std::string to, Tensor x, int64_t y, int64_t z);
// Kills this process at once, as a crash would.
int64_t crash();
std::string whoami();

}  // namespace gw::rpc::testing
