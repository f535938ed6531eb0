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

namespace {
std::vector<Tensor> tensors_of(Message& m) {
  std::vector<Tensor> out;
  for_each_value(m, [&](const IValue& v) { v.collect_tensors(out); });
  return out;
}
}  // namespace

void AutogradHook::outgoing(int to, Message& m, uint64_t autograd_context) {
  if (autograd_context == 0) return;
  AutogradInfo info = record_send(autograd_context, to, tensors_of(m));
  // A request always carries its context, so that the callee's nested calls join it; a
  // response only when it carries gradients back.
  if (m.request() || info.message_id) m.autograd = info;
}

void AutogradHook::cancelled(Message& m) {
  if (m.autograd) discard_send(*m.autograd);
  m.autograd.reset();
}

void AutogradHook::incoming(int from, Message& m, Arrival arrival) {
  if (arrival == Arrival::kLateResponse || !m.autograd) return;
  record_recv(from, *m.autograd, tensors_of(m));
}

}  // namespace gw::rpc
