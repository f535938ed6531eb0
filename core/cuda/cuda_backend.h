// The CUDA implementation of the Backend interface (core/backend.h).
//
// core's backend_for(DeviceType::CUDA) returns it in a build with CUDA, so every core op
// works on CUDA tensors unchanged; nothing here is called directly by user code:
//
//   gw::Tensor x = gw::randn({64, 128}).to(gw::cuda_device(0));
//   gw::Tensor y = gw::softmax(gw::matmul(x, x.t()), -1);   // cuBLAS, then a softmax kernel
//   std::cout << y.to(gw::kCPU) << "\n";
//
// Kernels run on the tensors' device, on that device's current stream (core/cuda/stream.h), and
// return without waiting, except copies to the host and ops that must check values (index
// bounds, bernoulli probabilities), which synchronize. Dtypes: those of the CPU backend plus
// float16/bfloat16 (computed in float) wherever the op is floating point.
#pragma once

#include "core/backend.h"

namespace gw::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CUDA; }
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
  void index_select(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) override;
  void gather(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& self, int64_t dim, const Tensor& index,
                   const Tensor& src) override;
  void unfold2d(const Tensor& x, const std::array<int64_t, 8>& params, const Tensor& cols) override;
  void fold2d(const Tensor& cols, const std::array<int64_t, 8>& params, const Tensor& x) override;
  bool has_fused_attention(const Tensor& q, const Tensor& v, bool dropout) const override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 const AttentionOptions& options, const Tensor& out, const Tensor& stats) override;
  void attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, const AttentionOptions& options, const Tensor& out,
                          const Tensor& stats, const Tensor& gq, const Tensor& gk,
                          const Tensor& gv) override;
  bool has_fused_adam() const override { return true; }
  void adam_step(std::span<const AdamParam> params, const AdamUpdate& update) override;
  void random(RandomKind kind, const Tensor& out, double a, double b, Generator& gen) override;
  void bernoulli(const Tensor& p, const Tensor& out, Generator& gen) override;
};

// The process's CUDA backend, which core's backend_for(DeviceType::CUDA) returns.
Backend& cuda_backend();

// Copies between two CUDA tensors of one device (any strides and dtypes), on its current
// stream; used by the backend's own kernels for layout changes.
void copy_on_device(const Tensor& src, const Tensor& dst);
// A contiguous tensor like `t` for a kernel to write into: `t` itself when it is contiguous.
Tensor contiguous_target(const Tensor& t);
// The other half: copies `written` into `out` unless it is `out` itself.
void write_back(const Tensor& written, const Tensor& out);

}  // namespace gw::cuda
