#include "rpc/autograd_hook.h"

#include <atomic>

namespace gw::rpc {

namespace {
thread_local uint64_t t_context = 0;
std::atomic<AutogradHookFactory> g_factory{nullptr};
}  // namespace

uint64_t current_autograd_context() { return t_context; }

AutogradContextScope::AutogradContextScope(uint64_t context_id) : previous_(t_context) {
  t_context = context_id;
}
AutogradContextScope::~AutogradContextScope() { t_context = previous_; }

void set_autograd_hook_factory(AutogradHookFactory factory) { g_factory.store(factory); }
AutogradHookFactory autograd_hook_factory() { return g_factory.load(); }

}  // namespace gw::rpc
