// The vocabulary of collectives (torch.distributed's): reduce operations and one options
// struct per collective, each with a timeout (zero: the group's default).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gw::dist {

enum class ReduceOp { SUM, AVG, PRODUCT, MIN, MAX };
std::string to_string(ReduceOp op);

using Milliseconds = std::chrono::milliseconds;
inline constexpr Milliseconds kGroupTimeout{0};  // use the group's timeout
// PyTorch's default collective timeout.
inline constexpr Milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(30)};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::SUM;
  Milliseconds timeout = kGroupTimeout;
};
struct BroadcastOptions {
  int root = 0;
  Milliseconds timeout = kGroupTimeout;
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::SUM;
  Milliseconds timeout = kGroupTimeout;
};
struct GatherOptions {
  int root = 0;
  Milliseconds timeout = kGroupTimeout;
};
using ScatterOptions = GatherOptions;
struct CollectiveOptions {  // allgather, reduce_scatter (op), alltoall, barrier, send/recv
  ReduceOp op = ReduceOp::SUM;
  Milliseconds timeout = kGroupTimeout;
};

}  // namespace gw::dist
