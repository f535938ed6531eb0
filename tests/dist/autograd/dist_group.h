// Agents for the distributed autograd tests: an rpc::testing::Group (tests/rpc/group.h) whose
// agents carry what gw::dist::init_rpc installs (dist/init_rpc.h).
#pragma once

#include <utility>

#include "dist/init_rpc.h"
#include "tests/rpc/group.h"

namespace gw::dist::testing {

struct DistGroup : rpc::testing::Group {
  explicit DistGroup(int n, rpc::RpcBackendOptions options = small_options())
      : Group(n, with_dist(std::move(options))) {}
};

}  // namespace gw::dist::testing
