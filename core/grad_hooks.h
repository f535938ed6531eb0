// The seam through which autograd records operations.
//
// core knows nothing of graphs, but its primitive ops are where history must be recorded.
// Each primitive computes its result with recording switched off (so its internal helper
// ops record nothing), then, if grad mode is on and an input requires grad, hands inputs and
// output to the GradRecorder that the autograd layer installed, which attaches a backward
// node to the output. Composite ops (mean, var, linear, ...) record through the primitives
// they call. Without the autograd layer nothing is installed and nothing is recorded.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace gw {

// Derivative rules live in the autograd layer; this is the list of primitives they cover.
class GradRecorder {
 public:
  virtual ~GradRecorder() = default;
  // a and b are the caller's operands (before promotion and broadcasting).
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void clamp(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi,
                     const Tensor& out) = 0;
  // dims: the reduced dims, wrapped and sorted (all dims when reducing everything).
  virtual void reduce(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim,
                      const Tensor& out) = 0;
  virtual void reduce_with_index(const Tensor& x, int64_t dim, bool keepdim,
                                 const Tensor& values, const Tensor& indices) = 0;
  // 2-D, or 3-D with one batch size.
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) = 0;
  virtual void index_select(const Tensor& x, int64_t dim, const Tensor& index,
                            const Tensor& out) = 0;
  virtual void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) = 0;
  virtual void scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                           const Tensor& out) = 0;
  virtual void cat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) = 0;
  // Same elements, new dtype/device/storage (to, clone, contiguous).
  virtual void convert(const Tensor& x, const Tensor& out) = 0;
  // Views and copies whose backward is a reshape, a permutation, or a sum over broadcast dims.
  virtual void reshape(const Tensor& x, const Tensor& out) = 0;
  virtual void permute(const Tensor& x, const Shape& dims, const Tensor& out) = 0;
  virtual void expand(const Tensor& x, const Tensor& out) = 0;
  // A view of part of x (slice, select, narrow): `replay` makes the same view of any tensor
  // shaped like x, so the backward can write the gradient through it.
  virtual void sub_view(const Tensor& x, const Tensor& out,
                        std::function<Tensor(const Tensor&)> replay) = 0;
  // im2col for conv2d (see core/ops/conv.h): kernel, stride, padding, dilation per dim.
  virtual void unfold2d(const Tensor& x, const std::array<int64_t, 8>& params,
                        const Tensor& out) = 0;
};

// Installed once by the autograd layer at load time.
void install_grad_recorder(GradRecorder* recorder);

bool grad_mode_enabled();
void set_grad_mode_enabled(bool enabled);

namespace detail {

// Read on every op: constinit spares the TLS wrapper call, initial-exec the TLS lookup.
extern GradRecorder* g_grad_recorder;
extern thread_local constinit bool t_grad_mode __attribute__((tls_model("initial-exec")));

// The recorder, if `out` of an op on these inputs must record its history.
inline GradRecorder* recorder_for(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_mode || g_grad_recorder == nullptr) return nullptr;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return g_grad_recorder;
  }
  return nullptr;
}
inline GradRecorder* recorder_for(const Tensor& x) { return recorder_for({&x}); }

// Switches recording off for the internals of a primitive op.
class NoRecordScope {
 public:
  NoRecordScope() : prev_(t_grad_mode) { t_grad_mode = false; }
  ~NoRecordScope() { t_grad_mode = prev_; }
  NoRecordScope(const NoRecordScope&) = delete;
  NoRecordScope& operator=(const NoRecordScope&) = delete;

 private:
  bool prev_;
};

// In-place ops cannot rewrite history yet: they refuse tensors that record it.
void check_inplace_allowed(const Tensor& self, const char* op);

}  // namespace detail
}  // namespace gw
