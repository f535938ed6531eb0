// Per-tensor autograd state, reached through TensorImpl::autograd_meta. Created lazily: a
// tensor that never took part in a graph carries none.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "autograd/node.h"

namespace gw::autograd {

using PostAccumulateHook = std::function<void(const Tensor&)>;
// By registration id. Replaced, never changed in place, so that AccumulateGrad runs a snapshot
// while hooks come and go (and a hook may remove itself).
using PostAccumulateHooks = std::vector<std::pair<uint64_t, PostAccumulateHook>>;

struct AutogradMeta {
  Tensor grad;                           // accumulated .grad of a leaf (or retained)
  std::shared_ptr<Node> grad_fn;         // null for leaves
  std::weak_ptr<Node> grad_accumulator;  // the AccumulateGrad of a leaf, while a graph uses it
  uint32_t output_nr = 0;
  bool retains_grad = false;
  std::vector<GradHook> leaf_hooks;                                  // register_hook on a leaf
  std::shared_ptr<const PostAccumulateHooks> post_accumulate_hooks;  // null: none yet
  std::mutex mutex;  // concurrent backward passes accumulate into grad
};

// The tensor's meta, created on first use.
AutogradMeta& meta(const Tensor& t);
// nullptr when the tensor has none.
AutogradMeta* meta_if(const Tensor& t);

}  // namespace gw::autograd
