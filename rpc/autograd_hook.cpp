#include "rpc/autograd_hook.h"

namespace gw::rpc {

namespace {
thread_local uint64_t t_context = 0;
}  // namespace

uint64_t current_autograd_context() { return t_context; }

AutogradContextScope::AutogradContextScope(uint64_t context_id) : previous_(t_context) {
  t_context = context_id;
}
AutogradContextScope::~AutogradContextScope() { t_context = previous_; }

}  // namespace gw::rpc
