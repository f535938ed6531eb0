// gw::Tensor — an n-dimensional array with a dtype and a device.
//
// Mental model (the same as PyTorch's): a Tensor is a cheap handle. Copying a Tensor copies
// the handle, not the data; both handles see the same elements. A tensor is a *view* into a
// reference-counted Storage described by sizes, strides and an offset, so reshape, transpose,
// slice, select, expand and friends return new views without copying. `clone()` and
// `contiguous()` (when needed) copy. Operations are free functions (core/ops.h) with
// operators and methods as sugar; they broadcast and promote dtypes like PyTorch.
//
//   #include "core/ops.h"
//   gw::Tensor a = gw::tensor({{1.f, 2.f}, {3.f, 4.f}});  // float32, shape (2,2)
//   gw::Tensor b = gw::ones({2});                         // broadcast along rows
//   gw::Tensor c = gw::matmul(a, a.t()) + b * 2;
//   float s = c.sum().item<float>();
//   std::cout << c << "\n";                               // tensor([[ 7., 13.], [13., 27.]])
//
// Autograd state (grad, grad_fn) lives in the autograd layer and is reached through
// `autograd_meta()`; core only keeps the requires_grad flag so that operations can tell
// cheaply whether to record.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/scalar.h"
#include "core/shape.h"
#include "core/storage.h"

namespace gw {

namespace autograd {
struct AutogradMeta;  // defined by the autograd layer
class Node;
}

// What a creation function makes: dtype, device and whether it requires grad.
struct TensorOptions {
  DType dtype = kFloat32;
  Device device = kCPU;
  bool requires_grad = false;  // set it with with_requires_grad, which installs autograd

  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}    // NOLINT: zeros({2}, gw::kInt64)
  TensorOptions(Device d) : device(d) {}  // NOLINT: zeros({2}, gw::kCPU)
  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  // Defined in the autograd layer, as Tensor::requires_grad_ is: asking for a gradient
  // installs autograd's recorder (core/grad_hooks.h).
  TensorOptions with_requires_grad(bool r) const;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = kFloat32;
  bool requires_grad = false;
  // Created at most once; has_autograd_meta (release/acquire) publishes it to other threads.
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;
  std::atomic<bool> has_autograd_meta{false};
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds no storage
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A view of `storage` with the given geometry (no checks beyond bounds).
  static Tensor make(std::shared_ptr<Storage> storage, Shape sizes, Shape strides,
                     int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  // Handles sharing this tensor (autograd steals gradients nobody else holds).
  long use_count() const { return impl_.use_count(); }

  // --- geometry -----------------------------------------------------------------------------
  const Shape& sizes() const { return checked()->sizes; }
  const Shape& shape() const { return sizes(); }
  const Shape& strides() const { return checked()->strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(sizes().size()); }
  int64_t numel() const { return gw::numel(sizes()); }
  int64_t storage_offset() const { return checked()->offset; }
  bool is_contiguous() const { return gw::is_contiguous(sizes(), strides()); }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->storage->device(); }
  TensorOptions options() const;
  size_t element_size() const { return itemsize(dtype()); }
  size_t nbytes() const { return numel() * element_size(); }
  const std::shared_ptr<Storage>& storage() const { return checked()->storage; }
  bool is_floating_point() const { return is_floating(dtype()); }

  // Pointer to the first element (storage base + offset). T must match the dtype.
  template <typename T>
  T* data_ptr() const {
    GW_CHECK(dtype_of_v<T> == dtype(), DTypeError, "[data_ptr] requested ",
             dtype_of_v<T>, " from a ", dtype(), " tensor");
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // The single value of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  Scalar item() const;
  // All elements in row-major order, converted to T (copies).
  template <typename T>
  std::vector<T> to_vector() const;

  // --- copies and conversions ---------------------------------------------------------------
  Tensor clone() const;
  Tensor contiguous() const;  // *this when already contiguous
  Tensor to(DType dtype) const;    // *this when already that dtype
  Tensor to(Device device) const;  // *this when already there
  Tensor detach() const;           // same storage, no autograd history
  // Makes this tensor, through every handle of it, refer to `src`'s data while keeping its own
  // autograd identity (PyTorch's `t.data = src`): how a parameter moves to another device or
  // dtype in place.
  void set_data(const Tensor& src) const;

  // --- views (share storage) ----------------------------------------------------------------
  Tensor view(Shape shape) const;
  Tensor reshape(Shape shape) const;  // a view when strides allow, else a copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a matrix (dims <= 2)
  Tensor permute(Shape dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(Shape shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // --- autograd flag (the engine itself is in the autograd layer) ---------------------------
  bool requires_grad() const { return checked()->requires_grad; }
  const std::shared_ptr<autograd::AutogradMeta>& autograd_meta() const {
    return checked()->autograd_meta;
  }

  // --- autograd (defined in the autograd layer: these need gw_autograd) ---------------------
  // Marks a leaf; asking for true installs autograd's recorder (core/grad_hooks.h).
  Tensor& requires_grad_(bool requires_grad = true);
  // Accumulates d(this)/d(leaf) into every leaf's .grad; `gradient` may be omitted for scalars.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  Tensor grad() const;  // undefined until a backward pass reaches this leaf
  void set_grad(const Tensor& grad) const;  // e.g. set_grad({}) to clear it
  std::shared_ptr<autograd::Node> grad_fn() const;
  bool is_leaf() const;
  void retain_grad() const;  // keep .grad of a non-leaf tensor
  // hook(grad) runs when this tensor's gradient is computed; a defined result replaces it.
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;

  // --- in-place ops (bump the version counter) ----------------------------------------------
  Tensor& zero_();
  Tensor& fill_(const Scalar& value);
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& add_(const Scalar& other);
  Tensor& sub_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& sub_(const Scalar& other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(const Scalar& other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(const Scalar& other);
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& masked_fill_(const Tensor& mask, const Scalar& value);
  Tensor& scatter_add_(int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& uniform_(double from = 0, double to = 1);  // default generator; see core/random.h
  Tensor& normal_(double mean = 0, double std = 1);
  void bump_version() const { storage()->bump_version(); }

  // --- method forms of common ops (see core/ops.h for the full list) ------------------------
  Tensor sum() const;
  Tensor sum(Shape dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(Shape dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor pow(const Scalar& exponent) const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor matmul(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;

  std::string str() const;  // PyTorch-style printing

 private:
  TensorImpl* checked() const {
    GW_CHECK(impl_ != nullptr, StateError, "[Tensor] use of an undefined tensor");
    return impl_.get();
  }

  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Hash and equality by identity (the same TensorImpl), for maps keyed by parameters.
struct TensorIdentityHash {
  size_t operator()(const Tensor& t) const { return std::hash<const void*>()(t.impl()); }
};
struct TensorIdentityEqual {
  bool operator()(const Tensor& a, const Tensor& b) const { return a.same(b); }
};
template <typename V>
using TensorMap = std::unordered_map<Tensor, V, TensorIdentityHash, TensorIdentityEqual>;

// --- creation from C++ data ---------------------------------------------------------------
// Copies `values` into a new tensor of `shape` (empty: 1-D); the dtype follows T (int is
// int32, as in C++). 0-dim tensors come from scalar_tensor.
template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape = {}, Device device = kCPU);
// Wraps external memory without copying; `deleter` runs when the last view is gone.
Tensor from_blob(void* data, Shape shape, DType dtype, Deleter deleter = {},
                 Device device = kCPU);
// tensor({1.f, 2.f}) and tensor({{1, 2}, {3, 4}}).
template <typename T>
Tensor tensor(std::initializer_list<T> values) {
  return from_vector(std::vector<T>(values));
}
template <typename T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows);
// A 0-dim tensor holding `value` (its dtype from the scalar kind unless given).
Tensor scalar_tensor(const Scalar& value);
Tensor scalar_tensor(const Scalar& value, TensorOptions options);

}  // namespace gw
