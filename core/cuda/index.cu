// index_select, gather and scatter_add. Index values are checked on the device: the first bad
// one is reported through an ErrorFlag and raised as the same IndexError the CPU raises (this
// synchronizes the stream). scatter_add adds with atomics, so the order of float additions
// into one element (and its rounding) may differ from run to run.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

[[noreturn]] void throw_bad_index(const char* op, long long idx, int64_t size, int64_t dim) {
  throw IndexError(
      detail::str("[", op, "] index ", idx, " is out of range for dim ", dim, " of size ", size));
}

// out (outer, count, inner) = x (outer, n, inner) at index (count) along the middle dim.
template <typename U>
__global__ void index_select_kernel(const U* x, const int64_t* index, U* out, int64_t total,
                                    int64_t n, int64_t count, int64_t inner, ErrorSlot err) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t r = i % inner, t = i / inner;
    const int64_t j = t % count, o = t / count;
    const int64_t idx = index[j];
    if (idx < 0 || idx >= n) {
      err.report(idx);
      continue;
    }
    out[i] = x[(o * n + idx) * inner + r];
  }
}

// Operands: 0 out, 1 index, 2 the input with stride 0 along dim.
template <typename U>
struct GatherFn {
  int64_t dim_stride;  // bytes
  int64_t n;
  ErrorSlot err;
  __device__ void operator()(char** p) const {
    const int64_t j = *reinterpret_cast<const int64_t*>(p[1]);
    if (j < 0 || j >= n) {
      err.report(j);
      return;
    }
    *reinterpret_cast<U*>(p[0]) = *reinterpret_cast<const U*>(p[2] + j * dim_stride);
  }
};

template <typename T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: an unsigned add is the signed add.
    atomicAdd(reinterpret_cast<unsigned long long*>(address),
              static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);
  }
}

// Operands: 0 self with stride 0 along dim, 1 index, 2 src.
template <typename T>
struct ScatterAddFn {
  int64_t dim_stride;  // bytes
  int64_t n;
  ErrorSlot err;
  __device__ void operator()(char** p) const {
    const int64_t j = *reinterpret_cast<const int64_t*>(p[1]);
    if (j < 0 || j >= n) {
      err.report(j);
      return;
    }
    atomic_add(reinterpret_cast<T*>(p[0] + j * dim_stride), *reinterpret_cast<const T*>(p[2]));
  }
};

// A view of `t` over `shape` whose stride along `dim` is 0: the index supplies that coordinate.
Tensor without_dim(const Tensor& t, const Shape& shape, int64_t dim) {
  Shape strides = t.strides();
  strides[dim] = 0;
  return Tensor::make(t.storage(), shape, std::move(strides), t.storage_offset(), t.dtype());
}

}  // namespace

void CudaBackend::index_select(const Tensor& in, int64_t dim, const Tensor& index,
                               const Tensor& out) {
  OnDevice on(out);
  Tensor x = in.contiguous(), idx = index.contiguous();
  Tensor o = contiguous_target(out);
  const int64_t n = x.size(dim), count = idx.numel();
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t total = o.numel();
  if (total == 0) {  // nothing to copy, but bad indices still fail, as on the CPU
    for (int64_t i : idx.to(kCPU).to_vector<int64_t>())
      if (i < 0 || i >= n) throw_bad_index("index_select", i, n, dim);
    return;
  }
  ErrorFlag flag(out.device(), on.stream);
  dispatch_by_size(x.element_size(), "index_select", [&]<typename U>() {
    index_select_kernel<<<grid_for(total), kThreads, 0, on.stream>>>(
        static_cast<const U*>(x.raw_data()), static_cast<const int64_t*>(idx.raw_data()),
        static_cast<U*>(o.raw_data()), total, n, count, inner, flag.slot());
    GW_CUDA_CHECK_LAUNCH();
  });
  if (auto bad = flag.check()) throw_bad_index("index_select", *bad, n, dim);
  write_back(o, out);
}

void CudaBackend::gather(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) {
  if (index.numel() == 0) return;
  OnDevice on(out);
  Tensor src = without_dim(in, index.sizes(), dim);
  auto it = make_iter<3>(index.sizes(), {&out, &index, &src}, "gather");
  ErrorFlag flag(out.device(), on.stream);
  const int64_t n = in.size(dim);
  const int64_t dim_stride = in.stride(dim) * static_cast<int64_t>(in.element_size());
  dispatch_by_size(in.element_size(), "gather", [&]<typename U>() {
    launch_strided(it, GatherFn<U>{dim_stride, n, flag.slot()}, on.stream);
  });
  if (auto bad = flag.check()) throw_bad_index("gather", *bad, n, dim);
}

void CudaBackend::scatter_add(const Tensor& self, int64_t dim, const Tensor& index,
                              const Tensor& src) {
  dispatch<CudaNumericTypes>(self.dtype(), "scatter_add", [&]<typename T>() {
    if (index.numel() == 0) return;
    OnDevice on(self);
    Tensor dst = without_dim(self, index.sizes(), dim);
    auto it = make_iter<3>(index.sizes(), {&dst, &index, &src}, "scatter_add");
    ErrorFlag flag(self.device(), on.stream);
    const int64_t n = self.size(dim);
    const int64_t dim_stride = self.stride(dim) * static_cast<int64_t>(self.element_size());
    launch_strided(it, ScatterAddFn<cuda_type_t<T>>{dim_stride, n, flag.slot()}, on.stream);
    if (auto bad = flag.check()) throw_bad_index("scatter_add", *bad, n, dim);
  });
}

}  // namespace gw::cuda
