// Tensor geometry: construction, element access, copies and views. Views only compute new
// sizes/strides/offset over the same Storage; nothing here touches element data except
// the copies, which go through the device backend.
#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"

namespace gw {

Tensor Tensor::make(std::shared_ptr<Storage> storage, Shape sizes, Shape strides,
                    int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// A 0-dim tensor has no dim to ask about (wrap_dim lets ops such as sum take dim 0 of one).
int64_t Tensor::size(int64_t d) const {
  GW_CHECK(dim() > 0, IndexError, "[size] dim ", d, " of a 0-dim tensor: it has no dims");
  return sizes()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  GW_CHECK(dim() > 0, IndexError, "[stride] dim ", d, " of a 0-dim tensor: it has no dims");
  return strides()[wrap_dim(d, dim(), "stride")];
}

TensorOptions Tensor::options() const {
  TensorOptions o;
  o.dtype = dtype();
  o.device = device();
  return o;
}

void* Tensor::raw_data() const {
  auto* p = static_cast<char*>(storage()->data());
  GW_CHECK(p != nullptr || numel() == 0, StateError, "[tensor] the memory of this ",
           shape_str(sizes()), " ", dtype(),
           " tensor was released (Storage::reset): a sharded "
           "parameter read outside its module's call, or a module called through forward() "
           "instead of operator() so that fully_shard's hooks did not gather it");
  return p + impl_->offset * static_cast<int64_t>(element_size());
}

template <typename T>
T Tensor::item() const {
  GW_CHECK(numel() == 1, InvalidArgumentError, "[item] a tensor with ", numel(),
           " elements cannot be converted to a scalar (shape ", shape_str(sizes()), ")");
  Tensor host = device().is_cpu() ? *this : to(kCPU);
  return dispatch<CopyTypes>(dtype(), "item", [&]<typename S>() {
    return convert<T>(*static_cast<const S*>(host.raw_data()));
  });
}

Scalar Tensor::item() const {
  if (is_floating_point()) return Scalar(item<double>());
  if (dtype() == kBool) return Scalar(item<bool>());
  return Scalar(item<int64_t>());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(kCPU).to(dtype_of_v<T>).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

#define GW_INSTANTIATE(T)                        \
  template T Tensor::item<T>() const;            \
  template std::vector<T> Tensor::to_vector<T>() const;
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
GW_INSTANTIATE(int64_t)
GW_INSTANTIATE(int32_t)
GW_INSTANTIATE(bool)
#undef GW_INSTANTIATE

namespace {
// Records `out` as a copy of `x` (same elements) when x's history is tracked.
Tensor record_convert(const Tensor& x, Tensor out) {
  if (GradRecorder* rec = detail::recorder_for(x)) rec->convert(x, out);
  return out;
}
// Records a view or reshape of `x`.
Tensor record_reshape(const Tensor& x, Tensor out) {
  if (GradRecorder* rec = detail::recorder_for(x)) rec->reshape(x, out);
  return out;
}
}  // namespace

Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), options());
  backend_for(*this, "clone").copy(*this, out);
  return record_convert(*this, std::move(out));
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(sizes(), options().with_dtype(target));
  backend_for(*this, "to").copy(*this, out);
  return record_convert(*this, std::move(out));
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(sizes(), options().with_device(target));
  // Host <-> device copies are run by the device's backend, whichever side it is on.
  Device accel = target.is_cpu() ? device() : target;
  backend_for(accel.type, "to").copy(*this, out);
  return record_convert(*this, std::move(out));
}

Tensor Tensor::detach() const {
  return make(storage(), sizes(), strides(), storage_offset(), dtype());
}

void Tensor::set_data(const Tensor& src) const {
  TensorImpl* impl = checked();
  GW_CHECK(src.defined(), InvalidArgumentError, "[set_data] the source tensor is undefined");
  impl->storage = src.storage();
  impl->sizes = src.sizes();
  impl->strides = src.strides();
  impl->offset = src.storage_offset();
  impl->dtype = src.dtype();
}

// ---------------------------------------------------------------------------------------------
// Views

namespace {
// Strides that let a tensor of (sizes, strides) be viewed as new_sizes without a copy, if any
// (the algorithm of PyTorch's computeStride: merge dims into contiguous chunks, then split).
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides,
                                  const Shape& new_sizes) {
  if (sizes.empty() || numel(sizes) == 0) return contiguous_strides(new_sizes);
  Shape out(new_sizes.size());
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}
}  // namespace

Tensor Tensor::view(Shape shape) const {
  Shape new_sizes = infer_shape(shape, numel(), "view");
  auto new_strides = view_strides(sizes(), strides(), new_sizes);
  GW_CHECK(new_strides.has_value(), ShapeError, "[view] a tensor of shape ", shape_str(sizes()),
           " and strides ", shape_str(strides()), " cannot be viewed as ", shape_str(new_sizes),
           " without a copy; use reshape");
  return record_reshape(*this, make(storage(), std::move(new_sizes), std::move(*new_strides),
                                    storage_offset(), dtype()));
}

Tensor Tensor::reshape(Shape shape) const {
  Shape new_sizes = infer_shape(shape, numel(), "reshape");
  if (auto s = view_strides(sizes(), strides(), new_sizes)) {
    return record_reshape(
        *this, make(storage(), std::move(new_sizes), std::move(*s), storage_offset(), dtype()));
  }
  Tensor copy;
  {
    detail::NoRecordScope no_record;
    copy = clone().view(std::move(new_sizes));
  }
  return record_reshape(*this, std::move(copy));
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  int64_t d0 = wrap_dim(dim0, dim(), "transpose"), d1 = wrap_dim(dim1, dim(), "transpose");
  if (dim() == 0) return *this;
  Shape sz = sizes(), st = strides();
  std::swap(sz[d0], sz[d1]);
  std::swap(st[d0], st[d1]);
  Tensor out = make(storage(), std::move(sz), std::move(st), storage_offset(), dtype());
  if (GradRecorder* rec = detail::recorder_for(*this)) {
    Shape perm(dim());
    for (int64_t i = 0; i < dim(); ++i) perm[i] = i;
    std::swap(perm[d0], perm[d1]);
    rec->permute(*this, perm, out);
  }
  return out;
}

Tensor Tensor::t() const {
  GW_CHECK(dim() <= 2, ShapeError, "[t] expects a tensor with <= 2 dims, got shape ",
           shape_str(sizes()));
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(Shape dims) const {
  GW_CHECK(static_cast<int64_t>(dims.size()) == dim(), ShapeError, "[permute] got ",
           dims.size(), " dims ", shape_str(dims), " for a tensor of ", dim(), " dims");
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    GW_CHECK(!seen[d], InvalidArgumentError, "[permute] dim ", dims[i], " repeated in ",
             shape_str(dims));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
    dims[i] = d;
  }
  Tensor out = make(storage(), std::move(sz), std::move(st), storage_offset(), dtype());
  if (GradRecorder* rec = detail::recorder_for(*this)) rec->permute(*this, dims, out);
  return out;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  GW_CHECK(dim() > 0, IndexError, "[slice] cannot slice a 0-dim tensor");
  d = wrap_dim(d, dim(), "slice");
  GW_CHECK(step > 0, InvalidArgumentError, "[slice] step must be positive, got ", step);
  int64_t n = sizes()[d];
  // Python slice semantics: negative bounds count from the end, then clamp to [0, n].
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sz = sizes(), st = strides();
  sz[d] = (end - start + step - 1) / step;
  st[d] *= step;
  Tensor out =
      make(storage(), std::move(sz), std::move(st), storage_offset() + start * strides()[d], dtype());
  if (GradRecorder* rec = detail::recorder_for(*this)) {
    rec->sub_view(*this, out, [d, start, end, step](const Tensor& t) {
      return t.slice(d, start, end, step);
    });
  }
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  GW_CHECK(dim() > 0, IndexError, "[narrow] cannot narrow a 0-dim tensor");
  d = wrap_dim(d, dim(), "narrow");
  int64_t n = sizes()[d];
  if (start < 0) start += n;
  GW_CHECK(start >= 0 && length >= 0 && length <= n - start, IndexError, "[narrow] start ", start,
           " and length ", length, " are out of range for dim ", d, " of size ", n);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  GW_CHECK(dim() > 0, IndexError, "[select] cannot index a 0-dim tensor");
  d = wrap_dim(d, dim(), "select");
  int64_t n = sizes()[d];
  GW_CHECK(index >= -n && index < n, IndexError, "[select] index ", index,
           " is out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  Tensor out =
      make(storage(), std::move(sz), std::move(st), storage_offset() + index * strides()[d], dtype());
  if (GradRecorder* rec = detail::recorder_for(*this)) {
    rec->sub_view(*this, out, [d, index](const Tensor& t) { return t.select(d, index); });
  }
  return out;
}

Tensor Tensor::expand(Shape shape) const {
  GW_CHECK(shape.size() >= sizes().size(), ShapeError, "[expand] cannot expand shape ",
           shape_str(sizes()), " to ", shape_str(shape), " (fewer dims)");
  size_t lead = shape.size() - sizes().size();
  Shape st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      GW_CHECK(shape[i] >= 0, ShapeError, "[expand] invalid size ", shape[i], " in new dim ", i);
      continue;
    }
    int64_t have = sizes()[i - lead];
    if (shape[i] == -1) shape[i] = have;
    GW_CHECK(shape[i] >= 0, ShapeError, "[expand] invalid size ", shape[i], " in dim ", i, " of ",
             shape_str(shape));
    GW_CHECK(shape[i] == have || have == 1, ShapeError, "[expand] cannot expand shape ",
             shape_str(sizes()), " to ", shape_str(shape), " (dim ", i, ": ", have, " vs ",
             shape[i], ")");
    st[i] = shape[i] == have ? strides()[i - lead] : 0;
  }
  Tensor out = make(storage(), std::move(shape), std::move(st), storage_offset(), dtype());
  if (GradRecorder* rec = detail::recorder_for(*this)) rec->expand(*this, out);
  return out;
}

Tensor Tensor::squeeze() const {
  Shape sz, st;
  for (int64_t i = 0; i < dim(); ++i) {
    if (sizes()[i] != 1) {
      sz.push_back(sizes()[i]);
      st.push_back(strides()[i]);
    }
  }
  return record_reshape(*this, make(storage(), std::move(sz), std::move(st), storage_offset(), dtype()));
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");  // a 0-dim tensor takes dims 0 and -1, as in PyTorch
  if (dim() == 0) return *this;
  if (sizes()[d] != 1) return *this;
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  return record_reshape(*this, make(storage(), std::move(sz), std::move(st), storage_offset(), dtype()));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sz = sizes(), st = strides();
  int64_t stride = d < dim() ? sizes()[d] * strides()[d] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return record_reshape(*this, make(storage(), std::move(sz), std::move(st), storage_offset(), dtype()));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  GW_CHECK(s <= e, InvalidArgumentError, "[flatten] start_dim ", start_dim,
           " comes after end_dim ", end_dim);
  Shape sz(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= sizes()[i];
  sz.push_back(n);
  sz.insert(sz.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(std::move(sz));
}

// ---------------------------------------------------------------------------------------------
// Creation from C++ data

template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape, Device device) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};  // 0-dim: scalar_tensor
  GW_CHECK(numel(shape) == static_cast<int64_t>(values.size()), ShapeError,
           "[from_vector] ", values.size(), " values do not fill shape ", shape_str(shape));
  Tensor host = empty(shape, TensorOptions(dtype_of_v<T>));
  T* p = static_cast<T*>(host.raw_data());
  std::copy(values.begin(), values.end(), p);  // std::vector<bool> has no data()
  return host.to(device);
}

template Tensor from_vector(const std::vector<float>&, Shape, Device);
template Tensor from_vector(const std::vector<double>&, Shape, Device);
template Tensor from_vector(const std::vector<int64_t>&, Shape, Device);
template Tensor from_vector(const std::vector<int32_t>&, Shape, Device);
template Tensor from_vector(const std::vector<bool>&, Shape, Device);

template <typename T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows) {
  std::vector<T> values;
  size_t cols = rows.size() ? rows.begin()->size() : 0;
  for (const auto& row : rows) {
    GW_CHECK(row.size() == cols, ShapeError, "[tensor] ragged rows: ", row.size(), " vs ",
             cols, " elements");
    values.insert(values.end(), row.begin(), row.end());
  }
  return from_vector(values, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(cols)});
}

template Tensor tensor(std::initializer_list<std::initializer_list<float>>);
template Tensor tensor(std::initializer_list<std::initializer_list<double>>);
template Tensor tensor(std::initializer_list<std::initializer_list<int64_t>>);
template Tensor tensor(std::initializer_list<std::initializer_list<int32_t>>);
template Tensor tensor(std::initializer_list<std::initializer_list<bool>>);

Tensor from_blob(void* data, Shape shape, DType dtype, Deleter deleter, Device device) {
  const auto nbytes = static_cast<size_t>(storage_nbytes(shape, itemsize(dtype), "from_blob"));
  auto storage = Storage::wrap(data, nbytes, device, deleter);
  Shape strides = contiguous_strides(shape);
  return Tensor::make(std::move(storage), std::move(shape), std::move(strides), 0, dtype);
}

Tensor scalar_tensor(const Scalar& value) {
  return scalar_tensor(value, TensorOptions(value.default_dtype()));
}

Tensor scalar_tensor(const Scalar& value, TensorOptions options) {
  return full({}, value, options);
}

}  // namespace gw
