// index_select, gather and scatter_add. Index values are checked on the device: the first bad
// one is reported through an ErrorFlag and raised as the same IndexError the CPU raises (this
// synchronizes the stream).
//
// scatter_add of whole rows, the gradient of index_select and of embedding (a 1-D index along
// dim 0, broadcast over the columns), sorts the rows by index (a stable radix sort) and gives
// each (index, column) one thread, which adds its rows in their order: no atomics to serialise
// on where many tokens share a row, and the CPU's sums, bit for bit, on every run. Other
// scatter_adds add with atomics, so the order of float additions into one element (and its
// rounding) may differ from run to run.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

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

// self[row] += the src rows whose index is row, in order: run r of the sorted indices is
// row unique[r], its rows order[offsets[r] .. offsets[r] + counts[r]). A thread per (run,
// column), columns fastest; runs past *runs (known on the device only) do nothing.
template <typename T>
__global__ void add_sorted_rows(T* self, int64_t rows, int64_t row_stride, int64_t cols,
                                const T* src, int64_t src_row_stride, int64_t src_col_stride,
                                const int64_t* unique, const int* counts, const int* offsets,
                                const int* runs, const int* order, ErrorSlot err) {
  using C = compute_t<T>;
  const int64_t total = static_cast<int64_t>(*runs) * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += step) {
    const int64_t r = t / cols, c = t % cols, row = unique[r];
    if (row < 0 || row >= rows) {
      err.report(row);
      continue;
    }
    C sum = cast<C>(self[row * row_stride + c]);
    const int end = offsets[r] + counts[r];
    for (int k = offsets[r]; k < end; ++k)
      sum += cast<C>(src[order[k] * src_row_stride + c * src_col_stride]);
    self[row * row_stride + c] = cast<T>(sum);
  }
}

// Device scratch of at least `bytes`, for CUB.
Tensor scratch(size_t bytes, Device device) {
  return empty({static_cast<int64_t>((bytes + 7) / 8)}, TensorOptions(kInt64).with_device(device));
}

// scatter_add of whole rows (dim 0 of a contiguous 2-D self, the index a column broadcast
// over src's columns), without atomics; false, doing nothing, for any other scatter_add.
template <typename T>
bool try_add_rows(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                  cudaStream_t stream) {
  if (dim != 0 || self.dim() != 2 || !self.is_contiguous() || index.dim() != 2 ||
      index.stride(1) != 0 || index.size(0) >= (int64_t{1} << 31))
    return false;
  const Device device = self.device();
  const int n = static_cast<int>(index.size(0));
  const int64_t rows = self.size(0), cols = index.size(1);
  auto on = [&](DType t) { return TensorOptions(t).with_device(device); };
  const Tensor keys = index.select(1, 0).contiguous();
  const Tensor positions = arange(n, on(kInt32));
  Tensor sorted = empty({n}, on(kInt64)), order = empty({n}, on(kInt32));
  Tensor unique = empty({n}, on(kInt64)), counts = zeros({n}, on(kInt32));
  Tensor offsets = empty({n}, on(kInt32)), runs = empty({1}, on(kInt32));
  const auto* k = static_cast<const int64_t*>(keys.raw_data());
  auto* ks = static_cast<int64_t*>(sorted.raw_data());
  auto* u = static_cast<int64_t*>(unique.raw_data());
  auto* c = static_cast<int*>(counts.raw_data());
  auto* o = static_cast<int*>(offsets.raw_data());
  auto* nr = static_cast<int*>(runs.raw_data());
  // Each CUB call twice: first for its scratch size, then to run.
  size_t bytes = 0;
  GW_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, k, ks, static_cast<const int*>(positions.raw_data()),
      static_cast<int*>(order.raw_data()), n, 0, 64, stream));
  Tensor temp = scratch(bytes, device);
  GW_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.raw_data(), bytes, k, ks, static_cast<const int*>(positions.raw_data()),
      static_cast<int*>(order.raw_data()), n, 0, 64, stream));
  bytes = 0;
  GW_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, bytes, ks, u, c, nr, n, stream));
  temp = scratch(bytes, device);
  GW_CUDA_CHECK(
      cub::DeviceRunLengthEncode::Encode(temp.raw_data(), bytes, ks, u, c, nr, n, stream));
  bytes = 0;
  GW_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, c, o, n, stream));
  temp = scratch(bytes, device);
  GW_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), bytes, c, o, n, stream));
  ErrorFlag flag(device, stream);
  add_sorted_rows<<<grid_for(static_cast<int64_t>(n) * cols), kThreads, 0, stream>>>(
      static_cast<T*>(self.raw_data()), rows, self.stride(0), cols,
      static_cast<const T*>(src.raw_data()), src.stride(0), src.stride(1), u, c, o, nr,
      static_cast<const int*>(order.raw_data()), flag.slot());
  GW_CUDA_CHECK_LAUNCH();
  if (auto bad = flag.check()) throw_bad_index("scatter_add", *bad, rows, dim);
  return true;
}

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
    if (try_add_rows<cuda_type_t<T>>(self, dim, index, src, on.stream)) return;
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
