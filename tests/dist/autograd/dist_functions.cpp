#include "tests/dist/autograd/dist_functions.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "core/ops.h"
#include "core/random.h"

namespace gw::dist::autograd::testing {

Tensor d_add(Tensor a, Tensor b) { return a + b; }
Tensor d_mul(Tensor a, Tensor b) { return a * b; }

Tensor d_nested(std::string to, Tensor a, Tensor b) {
  return rpc::rpc_sync(to, d_mul, a, b) + a;
}

Tensor d_leaf(int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  return rand({3, 3}, gen).requires_grad_();
}

Tensor d_fetch_triple(rpc::RRef<Tensor> r) { return r.to_here() * 3.0; }

Tensor d_failing_backward(Tensor a) {
  Tensor out = a * 2.0;
  out.register_hook([](const Tensor&) -> Tensor {
    throw InvalidArgumentError("backward failed on purpose");
  });
  return out;
}

Tensor d_crashing_backward(Tensor a) {
  Tensor out = a * 2.0;
  out.register_hook([](const Tensor&) -> Tensor { std::_Exit(3); });
  return out;
}

Tensor d_grad_of(int64_t context_id, rpc::RRef<Tensor> r) {
  auto grads = get_gradients(static_cast<uint64_t>(context_id));
  auto it = grads.find(r.local_value());
  GW_CHECK(it != grads.end(), InvalidArgumentError, "[d_grad_of] no gradient in context ",
           context_id);
  return it->second;
}

bool d_has_grad_of(int64_t context_id, rpc::RRef<Tensor> r) {
  return get_gradients(static_cast<uint64_t>(context_id)).contains(r.local_value());
}

Tensor d_relay(std::string to, std::string function, Tensor a) {
  return rpc::rpc_sync<Tensor>(to, function, a);
}

namespace {
std::mutex g_gate_mu;
std::condition_variable g_gate_cv;
bool g_gate_open = false;
}  // namespace

Tensor d_gated(Tensor a) {
  std::unique_lock lock(g_gate_mu);
  g_gate_cv.wait(lock, [] { return g_gate_open; });
  return a * 1.0;
}
void d_open_gate() {
  {
    std::lock_guard lock(g_gate_mu);
    g_gate_open = true;
  }
  g_gate_cv.notify_all();
}
void d_close_gate() {
  std::lock_guard lock(g_gate_mu);
  g_gate_open = false;
}

int64_t d_num_contexts() { return static_cast<int64_t>(num_contexts()); }

GW_RPC_FUNCTION(d_add);
GW_RPC_FUNCTION(d_mul);
GW_RPC_FUNCTION(d_nested);
Tensor d_leaf64(int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  return rand({2, 3}, gen, kFloat64).requires_grad_();
}

Tensor d_op(int64_t code, Tensor a, Tensor b) {
  switch (code) {
    case 0:
      return a + b;
    case 1:
      return a - b;
    case 2:
      return a * b;
    case 3:
      return a * 0.5 + b.tanh();
    case 4:
      return a * b + a;
    default:
      throw InvalidArgumentError(gw::detail::str("[d_op] no op ", code));
  }
}

Tensor d_nested_op(std::string to, int64_t code, int64_t code2, Tensor a, Tensor b) {
  return d_op(code2, rpc::rpc_sync(to, d_op, code, a, b), a);
}

Tensor d_fetch_op(int64_t code, rpc::RRef<Tensor> r, Tensor x) {
  return d_op(code, r.to_here(), x);
}

GW_RPC_FUNCTION(d_leaf64);
GW_RPC_FUNCTION(d_op);
GW_RPC_FUNCTION(d_nested_op);
GW_RPC_FUNCTION(d_fetch_op);
GW_RPC_FUNCTION(d_leaf);
GW_RPC_FUNCTION(d_fetch_triple);
GW_RPC_FUNCTION(d_failing_backward);
GW_RPC_FUNCTION(d_crashing_backward);
GW_RPC_FUNCTION(d_grad_of);
GW_RPC_FUNCTION(d_has_grad_of);
GW_RPC_FUNCTION(d_num_contexts);
GW_RPC_FUNCTION(d_relay);
GW_RPC_FUNCTION(d_gated);

}  // namespace gw::dist::autograd::testing

#include "dist/nn/remote_module.h"
#include "nn/linear.h"

namespace gw::dist::autograd::testing {

Tensor d_random_tensor() { return rand({3, 3}).requires_grad_(); }
Tensor d_square_sum(rpc::RRef<Tensor> r) {
  Tensor v = r.to_here();
  return (v * v).sum();
}
std::optional<Tensor> d_grad_field(rpc::RRef<Tensor> r) {
  Tensor g = r.local_value().grad();
  return g.defined() ? std::optional<Tensor>(g) : std::nullopt;
}
GW_RPC_FUNCTION(d_random_tensor);
GW_RPC_FUNCTION(d_square_sum);
GW_RPC_FUNCTION(d_grad_field);

namespace {
struct SeededLinear : nn::Linear {
  SeededLinear(int64_t in, int64_t out, int64_t seed)
      : nn::Linear(in, out, [&]() -> Generator& {
          static thread_local Generator gen;
          gen.manual_seed(static_cast<uint64_t>(seed));
          return gen;
        }()) {}
};
const bool kLinear = [] {
  dist::add_module_constructor<SeededLinear, int64_t, int64_t, int64_t>("d_linear");
  return true;
}();
}  // namespace

}  // namespace gw::dist::autograd::testing
