// The device seam. Operations in core/ops do everything that does not depend on the device —
// argument checks, broadcasting, dtype promotion, output allocation, views — and then call
// the Backend registered for the tensors' DeviceType to run the kernel. CPU kernels live in
// core/cpu (Eigen), CUDA kernels in core/cuda; backend_for picks one by device type, so op
// call sites never change when a device is added.
//
// Contract for every kernel: inputs and outputs are on this backend's device; elementwise
// inputs are already expanded to the output's shape (stride 0 on broadcast dims) and converted
// to the compute dtype; outputs are freshly allocated or explicitly passed by the user, and may
// be strided.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "core/device.h"
#include "core/op_list.h"
#include "core/scalar.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace gw {

class Generator;

// The elementwise ops, their names and dtype rules: one line each in core/op_list.h.
#define GW_OP_ENUM(Enum, ...) Enum,
enum class UnaryOp : uint8_t { GW_UNARY_OPS(GW_OP_ENUM) };
enum class BinaryOp : uint8_t { GW_BINARY_OPS(GW_OP_ENUM) };
#undef GW_OP_ENUM
// Which dtypes an elementwise op takes (see core/op_list.h).
enum class OpRule : uint8_t { kFloat, kNumeric, kAll, kLogical, kArith, kCompare };

constexpr const char* op_name(UnaryOp op) {
  switch (op) {
#define GW_OP_NAME(Enum, name, ...) \
  case UnaryOp::Enum:               \
    return #name;
    GW_UNARY_OPS(GW_OP_NAME)
#undef GW_OP_NAME
  }
  return "?";
}
constexpr const char* op_name(BinaryOp op) {
  switch (op) {
#define GW_OP_NAME(Enum, name, ...) \
  case BinaryOp::Enum:              \
    return #name;
    GW_BINARY_OPS(GW_OP_NAME)
#undef GW_OP_NAME
  }
  return "?";
}
constexpr OpRule op_rule(UnaryOp op) {
  switch (op) {
#define GW_OP_RULE(Enum, name, rule, ...) \
  case UnaryOp::Enum:                     \
    return OpRule::rule;
    GW_UNARY_OPS(GW_OP_RULE)
#undef GW_OP_RULE
  }
  return OpRule::kAll;
}
constexpr OpRule op_rule(BinaryOp op) {
  switch (op) {
#define GW_OP_RULE(Enum, name, rule, ...) \
  case BinaryOp::Enum:                    \
    return OpRule::rule;
    GW_BINARY_OPS(GW_OP_RULE)
#undef GW_OP_RULE
  }
  return OpRule::kArith;
}
// Under autocast, whether the op computes a 16-bit input in float32 (`f32` in core/op_list.h).
constexpr bool autocast_in_float32(UnaryOp op) {
  switch (op) {
#define GW_UNARY_AMP(Enum, name, rule, fn, amp) \
  case UnaryOp::Enum:                           \
    return std::string_view(#amp) == "f32";
    GW_UNARY_OPS(GW_UNARY_AMP)
#undef GW_UNARY_AMP
  }
  return false;
}
constexpr bool autocast_in_float32(BinaryOp op) {
  switch (op) {
#define GW_BINARY_AMP(Enum, name, rule, amp) \
  case BinaryOp::Enum:                       \
    return std::string_view(#amp) == "f32";
    GW_BINARY_OPS(GW_BINARY_AMP)
#undef GW_BINARY_AMP
  }
  return false;
}
// Comparisons and logic: bool out.
constexpr bool is_comparison(BinaryOp op) { return op_rule(op) != OpRule::kArith; }

enum class ReduceOp : uint8_t { Sum, Prod, Max, Min };
enum class RandomKind : uint8_t { Uniform, Normal, RandInt, Bernoulli };

// One parameter of a fused Adam step (Backend::adam_step): param, grad and the moments are
// contiguous tensors of one floating dtype on one device.
struct AdamParam {
  Tensor param, grad, exp_avg, exp_avg_sq;
  Tensor max_exp_avg_sq;         // defined with amsgrad
  double step_size;              // lr / (1 - beta1^step), the parameter's own step count
  double bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};
// What a fused Adam step does to every parameter of a group, in this order: the parameter is
// scaled by param_scale (AdamW's decoupled decay, 1 - lr * weight_decay), the gradient negated
// if maximize and given weight_decay * param (Adam's coupled decay), the moments updated, then
// param -= step_size * exp_avg / (sqrt(second moment) / bias_correction2_sqrt + eps).
struct AdamUpdate {
  double beta1, beta2, eps;
  double weight_decay;  // coupled (Adam); 0 for AdamW
  double param_scale;   // decoupled (AdamW); 1 for Adam
  bool amsgrad, maximize;
};
// How a fused attention kernel weighs the keys: causal (key j takes part in row i only if
// j <= i), the scores' scale, and dropout on the probabilities, each dropped with probability
// dropout_p and the rest scaled by 1 / (1 - dropout_p), as drawn from dropout_seed and the
// element's place alone, so that the backward draws the same (FlashAttention's Philox seed and
// offset).
struct AttentionOptions {
  bool causal = false;
  double scale = 1;
  double dropout_p = 0;
  uint64_t dropout_seed = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;

  virtual std::shared_ptr<Storage> allocate(size_t nbytes, Device device) = 0;
  // dst = src elementwise (same shape, any strides, converts dtype). Either side may be on this
  // backend's device; the other one may be on the CPU (host <-> device copies).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, const Scalar& value) = 0;
  // out[i] = start + i * step over the flattened (contiguous) out.
  virtual void iota(const Tensor& out, double start, double step) = 0;

  virtual void unary(UnaryOp op, const Tensor& in, const Tensor& out) = 0;
  // out = g * d op(x)/dx in one pass (PyTorch's gelu_backward, silu_backward), g, x and out of
  // one shape and floating dtype. Only ops the backend names in has_fused_unary_backward;
  // unary_derivative composes the others from ops.
  virtual bool has_fused_unary_backward(UnaryOp) const { return false; }
  virtual void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& out);
  // a, b have the compute dtype; out has it too, or bool for comparisons.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = a + alpha * b (axpy), a and b of out's dtype: one pass for add(a, b, alpha) and the
  // optimizers' param.add_(grad, -lr).
  virtual void add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha,
                          const Tensor& out) = 0;
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void clamp(const Tensor& in, std::optional<Scalar> lo, std::optional<Scalar> hi,
                     const Tensor& out) = 0;
  // `out` is given with in's shape but size 1 on the reduced dims (contiguous); the kernel
  // overwrites it.
  virtual void reduce(ReduceOp op, const Tensor& in, const Tensor& out) = 0;
  // Max/Min along `dim`, writing values and int64 indices of in's shape minus that dim.
  virtual void reduce_with_index(ReduceOp op, const Tensor& in, int64_t dim,
                                 const Tensor& values, const Tensor& indices) = 0;
  // Batched matrix product: a (B,n,k), b (B,k,m), out (B,n,m) contiguous, or the same without
  // the batch dim. Either input may be strided (transposed views are used without copies).
  virtual void bmm(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = input + a @ b for 2-D a (n,k), b (k,m) and out (n,m) contiguous, floating, input of
  // their dtype broadcasting to (n,m): the product accumulated onto the bias it starts from (a
  // GEMM writes its output once instead of zeroing it, and no pass adds the bias after). Only
  // backends that say so in has_fused_addmm; addmm composes matmul and add elsewhere.
  virtual bool has_fused_addmm() const { return false; }
  virtual void addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out);
  // out = a @ b and row_sums = a's rows summed over k, for 2-D a (n,k), b (k,m), out (n,m) and
  // row_sums (n), out and row_sums contiguous, all of one floating dtype: a Linear's weight and
  // bias gradients, dYᵀ X and the column sums of dY, from one read of dY. The sums have sum()'s
  // bits. Returns false, writing nothing, where the backend does not fuse the two for these
  // operands (the caller then takes mm and sum): the CPU fuses float32 where a is a transposed
  // view; CUDA does not (cuBLASLt's BGRADB epilogue is its way).
  virtual bool mm_row_sums(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    return false;
  }
  virtual void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) = 0;

  // Fused row ops, each one pass over memory where the composite would take several. Every
  // tensor is contiguous; x and logits are (rows, n). Statistics kept for the backward
  // (mean, rstd, lse: one per row) have x's dtype, float32 for 16-bit x.
  //
  // y = (x - mean) * rstd * weight + bias per row, rstd = 1 / sqrt(biased variance + eps);
  // weight and bias (n) may be undefined.
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  // Its gradients; an undefined gx, gweight or gbias is not computed.
  virtual void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& gx,
                                   const Tensor& gweight, const Tensor& gbias) = 0;
  // loss = lse - logits[target] per row, lse = log(sum(exp(logits))); target holds int64
  // classes, already checked to be in [0, n).
  virtual void cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                             const Tensor& lse) = 0;
  // grad_logits = grad_loss[row] * (exp(logits - lse) - (column == target)).
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                      const Tensor& grad_loss, const Tensor& grad_logits) = 0;
  virtual void index_select(const Tensor& in, int64_t dim, const Tensor& index,
                            const Tensor& out) = 0;
  virtual void gather(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) = 0;
  // self[index[i][j]][j] += src[i][j] (for dim 0), in place on self.
  virtual void scatter_add(const Tensor& self, int64_t dim, const Tensor& index,
                           const Tensor& src) = 0;
  // im2col and its adjoint for 2-D convolution. x (N,C,H,W) <-> cols (N, C*kh*kw, oh*ow);
  // params: kernel h/w, stride h/w, padding h/w, dilation h/w. fold2d overwrites x.
  virtual void unfold2d(const Tensor& x, const std::array<int64_t, 8>& params,
                        const Tensor& cols) = 0;
  virtual void fold2d(const Tensor& cols, const std::array<int64_t, 8>& params,
                      const Tensor& x) = 0;
  // Attention without the (L x S) score matrix (FlashAttention's online softmax): q (B,H,L,E),
  // k (B,H,S,E), v (B,H,S,Ev) and out (B,H,L,Ev), each with a unit last stride and any others
  // (MultiheadAttention's heads are transposed views); mask undefined or an additive mask of
  // q's dtype viewed as (B,H,L,S) or the batch dims it came with, with any strides (0 on
  // broadcast dims); options: causality, scale and dropout. stats (2,BH,L) receives
  // each row's maximum score m ([0]; +inf for a row whose every key is masked) and log(l), l its
  // sum of exp(s - m) ([1]), in the backend's units, from which the backward recomputes the
  // probabilities (apart, as m + log(l) would lose log(l) where |m| is huge). Only
  // backends that say so in has_fused_attention, for q's device and dtype, the head dims of q
  // and v and whether there is dropout, implement it; scaled_dot_product_attention composes
  // matmul, softmax and dropout elsewhere.
  virtual bool has_fused_attention(const Tensor& /*q*/, const Tensor& /*v*/,
                                   bool /*dropout*/) const {
    return false;
  }
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionOptions& options, const Tensor& out, const Tensor& stats);
  // Its gradients: gout (B,H,L,Ev), gq, gk, gv (overwritten) laid out as out, q, k, v may be.
  virtual void attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& mask,
                                  const AttentionOptions& options, const Tensor& out,
                                  const Tensor& stats, const Tensor& gq, const Tensor& gk,
                                  const Tensor& gv);
  // Adam/AdamW on many parameters in a few launches (PyTorch's fused=True). Only backends
  // that say so in has_fused_adam implement it; the optimizers compose the same update from
  // ops elsewhere (the CPU keeps PyTorch's single-tensor arithmetic, op by op).
  virtual bool has_fused_adam() const { return false; }
  virtual void adam_step(std::span<const AdamParam> params, const AdamUpdate& update);
  // Uniform: [a, b); Normal: mean a, std b; RandInt: [a, b); Bernoulli: probability a.
  virtual void random(RandomKind kind, const Tensor& out, double a, double b,
                      Generator& gen) = 0;
  // out = (uniform < p) elementwise, with a tensor of probabilities p (already expanded).
  virtual void bernoulli(const Tensor& p, const Tensor& out, Generator& gen) = 0;
};

// The backend for a device type: core/cpu/ or core/cuda/. Throws naming `op` for CUDA in a build
// without it.
Backend& backend_for(DeviceType type, const char* op);
inline Backend& backend_for(const Tensor& t, const char* op) {
  return backend_for(t.device().type, op);
}

// --- shared by the backends' kernels ---------------------------------------------------------

// Unary ops defined on floating point only (an integer input is promoted to float32 first).
constexpr bool is_float_only(UnaryOp op) { return op_rule(op) == OpRule::kFloat; }

// How a GEMM can read a (rows, cols) matrix with the given element strides without a copy.
enum class MatrixLayout { RowMajor, ColMajor, Copy };
struct MatrixView {
  MatrixLayout layout;
  int64_t ld;  // leading dimension for that layout
};
MatrixView classify_matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

// unfold2d / fold2d's shapes: x (n, c, h, w), the params in Backend order, the output size.
struct Conv2dGeometry {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
};
Conv2dGeometry conv2d_geometry(const Tensor& x, const std::array<int64_t, 8>& params);
// The bounds of T's values: infinities where T has them (an open clamp bound, a max's start).
template <typename T>
T lowest_value() {
  using L = std::numeric_limits<T>;
  return L::has_infinity ? -L::infinity() : L::lowest();
}
template <typename T>
T highest_value() {
  using L = std::numeric_limits<T>;
  return L::has_infinity ? L::infinity() : L::max();
}
// What a reduction starts from, in its accumulator type A.
template <typename A>
A reduce_identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return A(0);
    case ReduceOp::Prod: return A(1);
    case ReduceOp::Max: return lowest_value<A>();
    case ReduceOp::Min: return highest_value<A>();
  }
  return A(0);
}

// The output length of one spatial dim of a convolution.
inline int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// Throws InvalidArgumentError naming `op` and the devices unless every defined tensor is on one
// device. Ops with several tensor inputs call it before dispatching: a kernel handed a tensor
// of another device would read foreign memory.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);

// Throws InvalidArgumentError naming `op` when `out` is an expanded view (a dim of stride 0 and
// size > 1): several of its elements are one place in memory, and a kernel writing them would
// keep an arbitrary one, or race. In-place ops and out= variants call it (fill_ and
// masked_fill_ write one value to every place, and do not, as in PyTorch).
void check_writable(const char* op, const Tensor& out);

}  // namespace gw
