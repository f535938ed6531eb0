// Device-side building blocks shared by the kernel files (*.cu), never by host-only code.
//
// Elementwise work of every kind (copy, fill, unary, binary, where, clamp, gather...) runs
// through ONE kernel template, strided_kernel<N, F>: operands share one shape, each has its
// own byte strides; each thread turns a linear index into N element pointers and calls the
// functor F with them. make_iter collapses mergeable dims first, so contiguous tensors become
// one long dim and the index arithmetic is a single division.
//
//   auto it = make_iter<2>(out.sizes(), {&out, &in}, "neg");
//   launch_strided(it, NegFn<float>{}, stream);   // NegFn: __device__ void operator()(char**)
//
// DType dispatch uses core's dispatch with the CUDA type lists below; gw::Half/BFloat16 map
// to __half/__nv_bfloat16 through cuda_type_t, and 16-bit floats compute in float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "core/backend.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/dtype.h"
#include "core/ops/creation.h"
#include "core/tensor.h"

namespace gw::cuda {

using CudaAllTypes = TypeList<float, double, int64_t, int32_t, bool, Half, BFloat16>;
using CudaNumericTypes = TypeList<float, double, int64_t, int32_t, Half, BFloat16>;
using CudaFloatTypes = TypeList<float, double, Half, BFloat16>;

template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<Half> {
  using type = __half;
};
template <>
struct CudaType<BFloat16> {
  using type = __nv_bfloat16;
};
// The device type of a host element type.
template <typename T>
using cuda_type_t = typename CudaType<T>::type;

template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
// What a kernel computes in for elements of type T.
template <typename T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

// NaN tests on computed values (compute_t); integers are never NaN.
__device__ __forceinline__ bool is_nan(float x) { return x != x; }
__device__ __forceinline__ bool is_nan(double x) { return x != x; }
template <typename A>
__device__ __forceinline__ bool is_nan(A) {
  return false;
}

// static_cast, extended to the 16-bit formats through float (as core's convert does on CPU).
template <typename D, typename S>
__device__ __forceinline__ D cast(S v) {
  if constexpr (std::is_same_v<S, __half>) {
    return cast<D>(__half2float(v));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return cast<D>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<D, __half>) {
    return __float2half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __float2bfloat16(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

template <typename T>
__device__ __forceinline__ compute_t<T> load(const char* p) {
  return cast<compute_t<T>>(*reinterpret_cast<const T*>(p));
}
template <typename T, typename V>
__device__ __forceinline__ void store(char* p, V v) {
  *reinterpret_cast<T*>(p) = cast<T>(v);
}

// Calls f.template operator()<U>() with U an unsigned type of `size` bytes: kernels that only
// move elements (where, gather, index_select) need their width, not their type.
template <typename F>
decltype(auto) dispatch_by_size(size_t size, const char* op, F&& f) {
  switch (size) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    case 8:
      return f.template operator()<uint64_t>();
    default:
      break;
  }
  throw InternalError(detail::str("[", op, "] no CUDA kernel for elements of ", size, " bytes"));
}

inline constexpr int kWarpSize = 32;
// The shared memory a kernel may take without opting in is 48 KiB, static and dynamic
// together: a row cached in dynamic shared memory gets this much, leaving 1 KiB for the
// kernels' static reduction slots.
inline constexpr size_t kRowCacheBytes = 47 * 1024;
inline constexpr int kMaxDims = 8;
inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

// N operands over one collapsed shape; strides in bytes, row-major (the last dim is fastest).
template <int N>
struct StridedIter {
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims][N] = {};
  char* data[N] = {};
};

// Collapses the dims of `shape` for operands `ts` (every one with shape's rank): size-1 dims
// are dropped and a dim merges into the next when every operand is contiguous across them.
template <int N>
StridedIter<N> make_iter(std::span<const int64_t> shape, const std::array<const Tensor*, N>& ts,
                         const char* op) {
  StridedIter<N> it;
  for (int k = 0; k < N; ++k) it.data[k] = static_cast<char*>(ts[k]->raw_data());
  it.numel = gw::numel(shape);
  int nd = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    int64_t st[N];
    for (int k = 0; k < N; ++k) {
      st[k] = ts[k]->strides()[i] * static_cast<int64_t>(ts[k]->element_size());
    }
    if (nd > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable &= it.strides[nd - 1][k] == st[k] * shape[i];
      if (mergeable) {
        it.sizes[nd - 1] *= shape[i];
        for (int k = 0; k < N; ++k) it.strides[nd - 1][k] = st[k];
        continue;
      }
    }
    GW_CHECK(nd < kMaxDims, InvalidArgumentError, "[", op, "] CUDA kernels take at most ", kMaxDims,
             " non-mergeable dims, got a tensor of shape ", shape_str(shape));
    it.sizes[nd] = shape[i];
    for (int k = 0; k < N; ++k) it.strides[nd][k] = st[k];
    ++nd;
  }
  if (nd == 0) {  // 0-dim or all ones: one element at the base pointers
    it.sizes[0] = 1;
    nd = 1;
  }
  it.ndim = nd;
  return it;
}

// Pointers of element `linear` (row-major over it.sizes) for every operand. I is the index
// type of the division chain: 32-bit whenever numel fits, since 64-bit division is a long
// instruction sequence on the GPU and this runs once per element. Offsets stay 64-bit.
template <int N, typename I>
__device__ __forceinline__ void element_ptrs(const StridedIter<N>& it, I linear, char* (&p)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) p[k] = it.data[k];
  if (it.ndim == 1) {  // contiguous or evenly strided: no division at all
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] += static_cast<int64_t>(linear) * it.strides[0][k];
    return;
  }
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < it.ndim) {
      const I size = static_cast<I>(it.sizes[d]);
      const I c = linear % size;
      linear /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) p[k] += static_cast<int64_t>(c) * it.strides[d][k];
    }
  }
}

template <int N, typename I, typename F>
__global__ void strided_kernel(StridedIter<N> it, F f) {
  const I n = static_cast<I>(it.numel);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    char* p[N];
    element_ptrs(it, i, p);
    f(p);
  }
}

inline unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <int N, typename F>
void launch_strided(const StridedIter<N>& it, const F& f, cudaStream_t stream) {
  if (it.numel == 0) return;
  // 32-bit indices leave room for the grid-stride step past the last element.
  if (it.numel < (int64_t{1} << 31)) {
    strided_kernel<N, uint32_t, F><<<grid_for(it.numel), kThreads, 0, stream>>>(it, f);
  } else {
    strided_kernel<N, int64_t, F><<<grid_for(it.numel), kThreads, 0, stream>>>(it, f);
  }
  GW_CUDA_CHECK_LAUNCH();
}

// --- the contiguous fast path ----------------------------------------------------------------
// Most elementwise work is on whole contiguous tensors of one dtype. Then each thread moves 16
// bytes per load and store (4 floats, 8 bf16) and computes on the lanes in registers, with no
// index arithmetic: what the memory system needs to run at its speed. try_launch_vector takes
// the path when every pointer is 16-byte aligned and the tensors are contiguous, and says
// whether it did; callers fall back to launch_strided otherwise.
//
//   if (!try_launch_vector<D, 2>(out, {&a, &b}, AddFn<D>{}, stream)) launch_strided(...);
//
// F maps K compute_t<T> values to one: __device__ compute_t<T> operator()(compute_t<T>...).

template <typename T>
inline constexpr int kVecWidth = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int K>
struct VectorArgs {
  T* out;
  const T* in[K];
  int64_t n;
};

template <typename T, int K, typename F>
__device__ __forceinline__ T apply_lanes(const F& f, const T (&x)[K]) {
  using C = compute_t<T>;
  if constexpr (K == 1) {
    return cast<T>(f(cast<C>(x[0])));
  } else {
    return cast<T>(f(cast<C>(x[0]), cast<C>(x[1])));
  }
}

// Each iteration moves two packs per operand, both loads issued before any arithmetic, so
// that enough bytes are in flight even when the functor is long (GELU's erf).
template <typename T, int K, typename F>
__global__ void vector_kernel(VectorArgs<T, K> a, F f) {
  constexpr int V = kVecWidth<T>;
  using P = Pack<T, V>;
  const int64_t packs = a.n / V;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto compute = [&](const P(&in)[K]) {
    P out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      T lanes[K];
#pragma unroll
      for (int k = 0; k < K; ++k) lanes[k] = in[k].v[j];
      out.v[j] = apply_lanes<T, K>(f, lanes);
    }
    return out;
  };
  int64_t i = first;
  for (; i + step < packs; i += 2 * step) {
    P in0[K], in1[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      in0[k] = reinterpret_cast<const P*>(a.in[k])[i];
      in1[k] = reinterpret_cast<const P*>(a.in[k])[i + step];
    }
    reinterpret_cast<P*>(a.out)[i] = compute(in0);
    reinterpret_cast<P*>(a.out)[i + step] = compute(in1);
  }
  if (i < packs) {
    P in0[K];
#pragma unroll
    for (int k = 0; k < K; ++k) in0[k] = reinterpret_cast<const P*>(a.in[k])[i];
    reinterpret_cast<P*>(a.out)[i] = compute(in0);
  }
  const int64_t tail = packs * V + first;  // fewer than V elements past the last pack
  if (tail < a.n) {
    T lanes[K];
#pragma unroll
    for (int k = 0; k < K; ++k) lanes[k] = a.in[k][tail];
    a.out[tail] = apply_lanes<T, K>(f, lanes);
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// T is the device element type (cuda_type_t) of `out` and every input.
template <typename T, int K, typename F>
bool try_launch_vector(const Tensor& out, const std::array<const Tensor*, K>& ins, const F& f,
                       cudaStream_t stream) {
  if (!out.is_contiguous() || !aligned16(out.raw_data())) return false;
  VectorArgs<T, K> a{static_cast<T*>(out.raw_data()), {}, out.numel()};
  for (int k = 0; k < K; ++k) {
    const Tensor& t = *ins[k];
    if (!t.is_contiguous() || t.sizes() != out.sizes() || t.dtype() != out.dtype() ||
        !aligned16(t.raw_data())) {
      return false;
    }
    a.in[k] = static_cast<const T*>(t.raw_data());
  }
  if (a.n == 0) return true;
  const int64_t pairs = std::max<int64_t>(a.n / kVecWidth<T> / 2, 1);  // two packs a thread
  vector_kernel<T, K, F><<<grid_for(pairs), kThreads, 0, stream>>>(a, f);
  GW_CUDA_CHECK_LAUNCH();
  return true;
}

// --- block-wide reductions ------------------------------------------------------------------

struct SumOf {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a + b;
  }
};
// The larger of two values that are never NaN.
struct MaxOf {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a > b ? a : b;
  }
};

// op over v of every thread of the block (kBlock threads, a multiple of 32), in every thread.
// Calls from one kernel may follow each other: the shared slots are released before returning.
template <int kBlock, typename C, typename Op>
__device__ __forceinline__ C block_all_reduce(C v, Op op) {
  constexpr int kWarps = kBlock / kWarpSize;
  __shared__ C partial[kWarps];
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  v = partial[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) v = op(v, partial[w]);
  __syncthreads();
  return v;
}

// The device and stream an op on `t` runs on: the device becomes current for the scope.
struct OnDevice {
  DeviceGuard guard;
  cudaStream_t stream;
  explicit OnDevice(const Tensor& t)
      : guard(t.device().index), stream(current_stream(t.device().index)) {}
};

// A device-side error report: kernels cannot throw, so a kernel that finds a bad value (an
// index out of range, a probability outside [0, 1]) records the first one here and the host
// raises it after the kernel (this synchronizes the stream).
struct ErrorSlot {
  int* flag;
  long long* value;
  __device__ void report(long long v) const {
    if (atomicCAS(flag, 0, 1) == 0) *value = v;
  }
};

class ErrorFlag {
 public:
  ErrorFlag(Device device, cudaStream_t stream)
      : buffer_(empty({2}, TensorOptions(kInt64).with_device(device))), stream_(stream) {
    GW_CUDA_CHECK(cudaMemsetAsync(buffer_.raw_data(), 0, 16, stream_));
  }
  ErrorSlot slot() const {
    auto* base = static_cast<long long*>(buffer_.raw_data());
    return ErrorSlot{reinterpret_cast<int*>(base), base + 1};
  }
  // The reported value, if a kernel reported one.
  std::optional<long long> check() const {
    long long host[2] = {0, 0};
    GW_CUDA_CHECK(cudaMemcpyAsync(host, buffer_.raw_data(), 16, cudaMemcpyDeviceToHost, stream_));
    GW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (host[0] == 0) return std::nullopt;  // the flag word; its upper half stays 0
    return host[1];
  }

 private:
  Tensor buffer_;
  cudaStream_t stream_;
};

}  // namespace gw::cuda
