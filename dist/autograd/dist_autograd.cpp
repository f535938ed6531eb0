#include "dist/autograd/dist_autograd.h"

#include "core/log.h"
#include "dist/autograd/context_container.h"
#include "rpc/agent.h"

namespace gw::dist::autograd {

namespace {
uint64_t new_context_id(Container& c) {
  GW_CHECK(rpc::current_autograd_context() == 0, StateError,
           "[dist_autograd.context] this thread is already in context ",
           rpc::current_autograd_context(), "; contexts do not nest");
  return c.new_context()->id();
}
}  // namespace

Context::Context()
    : container_(Container::current().weak_from_this()),
      id_(new_context_id(Container::current())),
      scope_(id_) {}

Context::~Context() {
  if (auto c = container_.lock()) c->release_later(id_);
}

void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph) {
  Container::current().backward(context_id, roots, retain_graph).wait();
}

void backward(uint64_t context_id, const std::vector<Tensor>& roots, BackwardOptions options) {
  Container::current()
      .backward(context_id, roots, options.retain_graph, options.mode == Mode::kSmart)
      .wait();
}

GradientMap get_gradients(uint64_t context_id) {
  return Container::current().retrieve(context_id)->gradients();
}

uint64_t current_context_id() { return rpc::current_autograd_context(); }
bool has_context(uint64_t context_id) { return Container::current().has_context(context_id); }
size_t num_contexts() { return Container::current().num_contexts(); }

void wait_for_releases(std::chrono::milliseconds timeout) {
  Container::current().flush(timeout);
}

}  // namespace gw::dist::autograd
