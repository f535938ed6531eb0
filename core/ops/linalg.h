// Matrix products on Eigen's GEMM. Transposed views are read as such (no copies); matmul
// follows torch.matmul: 1-D·1-D is a dot product, 1-D operands are promoted to matrices and
// the added dim removed again, and batch dims broadcast.
#pragma once

#include <optional>
#include <utility>

#include "core/tensor.h"

namespace gw {

Tensor mm(const Tensor& a, const Tensor& b);    // (n,k) @ (k,m)
Tensor bmm(const Tensor& a, const Tensor& b);   // (B,n,k) @ (B,k,m)
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor dot(const Tensor& a, const Tensor& b);   // 1-D · 1-D
// input + a @ b, as torch.addmm: a (n,k), b (k,m), input broadcasting to (n,m) (a bias row of
// m). On the CPU the product accumulates onto the broadcast input in one GEMM.
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b);
// x @ weight.T + bias, as torch.nn.functional.linear (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

namespace detail {
// (a @ b, a's rows summed) for 2-D a (n,k) and b (k,m) in one read of a, recording no
// gradient, where a's backend fuses the two (the CPU's float32 GEMM, when a is a transposed
// view, as dYᵀ is: the sums in double, k in order, the bits of sum(aᵀ, {0})); nullopt
// otherwise. Autograd's rule for a Linear's weight and bias gradients, dYᵀ X and the column
// sums of dY, which composes mm and sum_to where this gives nullopt.
std::optional<std::pair<Tensor, Tensor>> mm_and_row_sums(const Tensor& a, const Tensor& b);
}  // namespace detail

}  // namespace gw
