// The CPU implementation of the Backend interface (core/backend.h). Kernels are split by
// family across cpu/*_kernels.cpp; this class only ties them together. They compute in float32
// and float64 (and the integer types); float16 and bfloat16 operands go through float32 copies
// (cpu/half_as_float.h), moves (copy, fill, where, gather, index_select) take them directly.
#pragma once

#include "core/backend.h"

namespace gw::cpu {

class CpuBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CPU; }
  std::shared_ptr<Storage> allocate(size_t nbytes, Device device) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, const Scalar& value) override;
  void iota(const Tensor& out, double start, double step) override;
  void unary(UnaryOp op, const Tensor& in, const Tensor& out) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void add_scaled(const Tensor& a, const Tensor& b, const Scalar& alpha,
                  const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void clamp(const Tensor& in, std::optional<Scalar> lo, std::optional<Scalar> hi,
             const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& in, const Tensor& out) override;
  void reduce_with_index(ReduceOp op, const Tensor& in, int64_t dim, const Tensor& values,
                         const Tensor& indices) override;
  void bmm(const Tensor& a, const Tensor& b, const Tensor& out) override;
  bool has_fused_addmm() const override { return true; }
  void addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) override;
  // float32 on the GEMM, where a is a transposed view (packed, and summed as it is).
  bool mm_row_sums(const Tensor& a, const Tensor& b, const Tensor& out,
                   const Tensor& row_sums) override;
  void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& gx,
                           const Tensor& gweight, const Tensor& gbias) override;
  void cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                     const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& grad_loss, const Tensor& grad_logits) override;
  bool has_fused_unary_backward(UnaryOp op) const override {
    return op == UnaryOp::Relu || op == UnaryOp::Gelu || op == UnaryOp::GeluTanh ||
           op == UnaryOp::Silu;
  }
  void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& out) override;
  bool has_fused_attention(const Tensor&, const Tensor&, bool) const override { return true; }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 const AttentionOptions& options, const Tensor& out, const Tensor& stats) override;
  void attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const AttentionOptions& options, const Tensor& out,
                          const Tensor& stats, const Tensor& gq, const Tensor& gk,
                          const Tensor& gv) override;
  void index_select(const Tensor& in, int64_t dim, const Tensor& index,
                    const Tensor& out) override;
  void gather(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& self, int64_t dim, const Tensor& index,
                   const Tensor& src) override;
  void unfold2d(const Tensor& x, const std::array<int64_t, 8>& params,
                const Tensor& cols) override;
  void fold2d(const Tensor& cols, const std::array<int64_t, 8>& params, const Tensor& x) override;
  void random(RandomKind kind, const Tensor& out, double a, double b, Generator& gen) override;
  void bernoulli(const Tensor& p, const Tensor& out, Generator& gen) override;
};

// The process's CPU backend (backend_for(CPU) returns it; no registration needed).
Backend& cpu_backend();

}  // namespace gw::cpu
