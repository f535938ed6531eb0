// The seam through which autograd records operations.
//
// core knows nothing of graphs, but its primitive ops are where history must be recorded.
// Each primitive computes its result with recording switched off (so its internal helper
// ops record nothing), then, if grad mode is on and an input requires grad, hands inputs and
// output to the GradRecorder that the autograd layer installed, which attaches a backward
// node to the output. Composite ops (mean, var, linear, ...) record through the primitives
// they call.
//
// The wiring is explicit. The two ways to ask for a gradient, Tensor::requires_grad_ and
// TensorOptions::with_requires_grad, are defined by the autograd layer, and install its
// recorder the first time they are asked for true. A factory given options that require grad
// without the recorder installed (the field set by hand, in a program without autograd)
// refuses them (StateError): a tensor never requires grad while nothing would record its
// history.
#pragma once

#include <array>
#include <atomic>
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
  // out = input + a @ b (2-D a and b; input broadcast to out).
  virtual void addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
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

// Called by the autograd layer before anything first requires grad.
void install_grad_recorder(GradRecorder* recorder);

bool grad_mode_enabled();
void set_grad_mode_enabled(bool enabled);

namespace detail {

// Set once, and read only once an input requires grad (so after it was set).
extern std::atomic<GradRecorder*> g_grad_recorder;
// Read on every op: constinit spares the TLS wrapper call, initial-exec the TLS lookup.
extern thread_local constinit bool t_grad_mode __attribute__((tls_model("initial-exec")));

// The recorder, if `out` of an op on these inputs must record its history. (An input that
// requires grad was marked after the recorder was installed.)
inline GradRecorder* recorder_for(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_mode) return nullptr;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return g_grad_recorder.load(std::memory_order_acquire);
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

// `t` requires grad from now on (`op` names who asks: Tensor::requires_grad_, or a factory given
// TensorOptions::requires_grad). Throws DTypeError unless `t` is floating point, StateError
// before autograd is installed. Factories fill their tensor with options `without_grad`, then
// mark it.
void mark_requires_grad(Tensor& t, const char* op);
inline TensorOptions without_grad(TensorOptions options) {
  options.requires_grad = false;
  return options;
}

}  // namespace detail
}  // namespace gw
