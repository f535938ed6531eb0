// The lock that serializes updates to the parameters this process owns, as the global lock of
// PyTorch's _LocalOptimizer: every LocalOptimizer step takes it (dist/optim), and so does code
// that must not see parameters mid-update: a parameter server's forward snapshot, a checkpoint
// of a RemoteModule's state (dist/checkpoint).
//
//   std::lock_guard lock(gw::dist::optimizer_step_lock());
#pragma once

#include <mutex>

namespace gw::dist {

// One lock per process: concurrent steps on a worker never interleave.
std::mutex& optimizer_step_lock();

}  // namespace gw::dist
