// Helpers of the fully_shard tests run as threads over Gloo (test_fsdp, test_fsdp_errors).
#pragma once

#include <memory>
#include <stdexcept>

#include "autograd/autograd.h"
#include "dist/process_group/process_group_gloo.h"
#include "nn/module.h"

namespace gw::fsdp::testing {

// The group run_ranks lends, as the shared_ptr fully_shard takes (not owned).
inline std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

// Makes the gradient reaching `module`'s output throw "injected" (from its next call on);
// returns the hook to remove.
inline int64_t throw_in_backward_of(nn::Module& module) {
  return module.register_forward_hook([](nn::Module&, const Tensor&, const Tensor& out) {
    autograd::Edge edge = autograd::gradient_edge(out);
    edge.fn->pre_hooks.emplace_back(
        edge.input_nr, [](const Tensor&) -> Tensor { throw std::runtime_error("injected"); });
    return Tensor();
  });
}

}  // namespace gw::fsdp::testing
