// Functions the distributed autograd tests run remotely; registered in the test binary and in
// the peer process (dist_autograd_peer), which both link dist_functions.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dist/autograd/dist_autograd.h"
#include "rpc/rpc.h"

namespace gw::dist::autograd::testing {

Tensor d_add(Tensor a, Tensor b);
Tensor d_mul(Tensor a, Tensor b);
// rpc_sync(to, d_mul, a, b) + a: a nested call whose result flows back through this worker.
Tensor d_nested(std::string to, Tensor a, Tensor b);
// A 3x3 leaf requiring grad, drawn from a generator seeded with `seed`.
Tensor d_leaf(int64_t seed);
// r.to_here() * 3 on the worker running it.
Tensor d_fetch_triple(rpc::RRef<Tensor> r);
// a * 2, whose backward throws InvalidArgumentError("backward failed on purpose").
Tensor d_failing_backward(Tensor a);
// a * 2, whose backward ends this process at once, as a crash would.
Tensor d_crashing_backward(Tensor a);
// The gradient that this worker's context `context_id` holds for the value `r` owns here.
Tensor d_grad_of(int64_t context_id, rpc::RRef<Tensor> r);
// Whether the owner of `r` holds a gradient for its value in the context.
bool d_has_grad_of(int64_t context_id, rpc::RRef<Tensor> r);
// rpc_sync(to, function, a): relays a call, so that its gradients pass through this worker.
Tensor d_relay(std::string to, std::string function, Tensor a);
// a * 1, after waiting until d_open_gate() is called in this process (d_close_gate re-arms).
Tensor d_gated(Tensor a);
void d_open_gate();
void d_close_gate();
// How many distributed autograd contexts this worker holds.
int64_t d_num_contexts();

// For the random-graph tests (test_dist_random.cpp), in float64:
// a 2x3 leaf requiring grad, drawn from a generator seeded with `seed`;
Tensor d_leaf64(int64_t seed);
// one of kNumOps ops of two tensors, each using both: a + b, a - b, a * b, 0.5 a + tanh(b),
// a * b + a;
inline constexpr int64_t kNumOps = 5;
Tensor d_op(int64_t code, Tensor a, Tensor b);
// d_op(code2, rpc_sync(to, d_op, code, a, b), a): a nested call whose result comes back here;
Tensor d_nested_op(std::string to, int64_t code, int64_t code2, Tensor a, Tensor b);
// d_op(code, r.to_here(), x) on the worker running it.
Tensor d_fetch_op(int64_t code, rpc::RRef<Tensor> r, Tensor x);

}  // namespace gw::dist::autograd::testing

namespace gw::dist::autograd::testing {
// torch.rand((3, 3), requires_grad=True) as in the distributed autograd design note's end-to-end
// example.
Tensor d_random_tensor();
// (r.to_here() ** 2).sum() on the worker running it.
Tensor d_square_sum(rpc::RRef<Tensor> r);
// The .grad of the value `r` owns here, if it has one.
std::optional<Tensor> d_grad_field(rpc::RRef<Tensor> r);
// RemoteModule's constructor "d_linear"(in, out, seed): an nn::Linear drawn from a generator
// seeded with `seed`.
}  // namespace gw::dist::autograd::testing
