// Reductions (sum, prod, max, min) and max/min with indices. The input is laid out as
// (rows, cols) with the reduced elements of one output contiguous in a row (a permuted copy
// when they are not), then one block reduces each row, or one thread when rows are short.
// Floating sums accumulate in double and integer sums in int64, as on the CPU.
#include <limits>

#include "cuda/cuda_backend.h"
#include "cuda/loops.cuh"

namespace gw::cuda {

namespace {

// Whether v replaces best for max/min: NaN wins over numbers and the first NaN is kept.
template <typename A>
__device__ __forceinline__ bool better(ReduceOp op, A v, A best) {
  if (is_nan(v)) return !is_nan(best);
  if (is_nan(best)) return false;
  return op == ReduceOp::Max ? v > best : v < best;
}

template <typename A>
__device__ __forceinline__ A combine(ReduceOp op, A acc, A v) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_same_v<A, bool>) return acc || v;
      else return acc + v;
    case ReduceOp::Prod:
      if constexpr (std::is_same_v<A, bool>) return acc && v;
      else return acc * v;
    default: return better(op, v, acc) ? v : acc;
  }
}

constexpr int kReduceThreads = 256;  // a power of two: the tree below halves it
// Rows of at most this many elements are reduced by one thread each.
constexpr int64_t kShortRow = 16;

// out[r] = reduction of x[r * cols .. r * cols + cols) for a contiguous (rows, cols) x.
template <typename T, typename A>
__global__ void reduce_rows_block(const T* x, A* out, int64_t rows, int64_t cols, ReduceOp op,
                                  A init) {
  __shared__ A shared[kReduceThreads];
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    A acc = init;
    for (int64_t i = tid; i < cols; i += kReduceThreads) acc = combine(op, acc, cast<A>(row[i]));
    shared[tid] = acc;
    __syncthreads();
    for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
      if (tid < s) shared[tid] = combine(op, shared[tid], shared[tid + s]);
      __syncthreads();
    }
    if (tid == 0) out[r] = shared[0];
    __syncthreads();  // shared[0] is read before the next row overwrites it
  }
}

template <typename T, typename A>
__global__ void reduce_rows_thread(const T* x, A* out, int64_t rows, int64_t cols, ReduceOp op,
                                   A init) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += step) {
    A acc = init;
    for (int64_t i = 0; i < cols; ++i) acc = combine(op, acc, cast<A>(x[r * cols + i]));
    out[r] = acc;
  }
}

// Max/min with the index of the first extreme element (NaN counts as the extreme).
template <typename C>
struct ValueIndex {
  C value;
  int64_t index;
};

template <typename C>
__device__ __forceinline__ ValueIndex<C> pick(ReduceOp op, ValueIndex<C> a, ValueIndex<C> b) {
  if (b.index < 0) return a;  // an empty slot
  if (a.index < 0) return b;
  if (better(op, b.value, a.value)) return b;
  if (better(op, a.value, b.value)) return a;
  return b.index < a.index ? b : a;  // ties and NaN pairs: the first one
}

template <typename T>
__global__ void arg_reduce_rows(const T* x, T* values, int64_t* indices, int64_t rows,
                                int64_t cols, ReduceOp op) {
  using C = compute_t<T>;
  __shared__ C shared_value[kReduceThreads];
  __shared__ int64_t shared_index[kReduceThreads];
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    ValueIndex<C> best{C(0), -1};
    for (int64_t i = tid; i < cols; i += kReduceThreads) {
      best = pick(op, best, ValueIndex<C>{cast<C>(row[i]), i});
    }
    shared_value[tid] = best.value;
    shared_index[tid] = best.index;
    __syncthreads();
    for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
      if (tid < s) {
        ValueIndex<C> m = pick(op, ValueIndex<C>{shared_value[tid], shared_index[tid]},
                               ValueIndex<C>{shared_value[tid + s], shared_index[tid + s]});
        shared_value[tid] = m.value;
        shared_index[tid] = m.index;
      }
      __syncthreads();
    }
    if (tid == 0) {
      values[r] = cast<T>(shared_value[0]);
      indices[r] = shared_index[0];
    }
    __syncthreads();
  }
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

// `in` with the dims in `front` first (in order) and the others after, contiguous.
Tensor rows_layout(const Tensor& in, const std::vector<int64_t>& front,
                   const std::vector<int64_t>& back) {
  Shape perm;
  for (int64_t d : front) perm.push_back(d);
  for (int64_t d : back) perm.push_back(d);
  return in.permute(perm).contiguous();
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& in, const Tensor& out) {
  GW_CHECK(in.dim() == out.dim(), InternalError, "[cuda reduce] input of shape ",
           shape_str(in.sizes()), " and output of shape ", shape_str(out.sizes()),
           " have different ranks");
  // Reduced dims are those where out has size 1 and in does not.
  std::vector<int64_t> kept, reduced;
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (out.size(d) == in.size(d)) {
      kept.push_back(d);
      rows *= in.size(d);
    } else {
      reduced.push_back(d);
      cols *= in.size(d);
    }
  }
  if (rows == 0) return;
  OnDevice on(out);
  dispatch<CudaAllTypes>(in.dtype(), "reduce", [&]<typename T>() {
    using D = cuda_type_t<T>;
    auto run = [&]<typename A>() {
      // Results land in a contiguous buffer of the accumulator type, then convert into out.
      Tensor acc = empty(out.sizes(), out.options().with_dtype(dtype_of_v<A>));
      const A init = reduce_identity<A>(op);
      if (cols == 0) {
        fill(acc, Scalar(init));
      } else {
        Tensor x = rows_layout(in, kept, reduced);
        const D* px = static_cast<const D*>(x.raw_data());
        A* pa = static_cast<A*>(acc.raw_data());
        if (cols <= kShortRow) {
          reduce_rows_thread<<<grid_for(rows), kThreads, 0, on.stream>>>(px, pa, rows, cols, op,
                                                                         init);
        } else {
          reduce_rows_block<<<row_grid(rows), kReduceThreads, 0, on.stream>>>(px, pa, rows, cols,
                                                                            op, init);
        }
        GW_CUDA_CHECK_LAUNCH();
      }
      copy_on_device(acc, out);
    };
    if (op == ReduceOp::Max || op == ReduceOp::Min) {
      run.template operator()<compute_t<D>>();
    } else if constexpr (is_floating(dtype_of_v<T>)) {
      run.template operator()<double>();
    } else {
      run.template operator()<int64_t>();
    }
  });
}

void CudaBackend::reduce_with_index(ReduceOp op, const Tensor& in, int64_t dim,
                                    const Tensor& values, const Tensor& indices) {
  const char* name = op == ReduceOp::Max ? "max" : "min";
  dispatch<CudaNumericTypes>(in.dtype(), name, [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t n = in.size(dim);
    const int64_t rows = n == 0 ? 0 : in.numel() / n;
    if (rows == 0) return;
    OnDevice on(values);
    std::vector<int64_t> others;
    for (int64_t d = 0; d < in.dim(); ++d) {
      if (d != dim) others.push_back(d);
    }
    Tensor x = rows_layout(in, others, {dim});
    Tensor v = contiguous_target(values), i = contiguous_target(indices);
    arg_reduce_rows<<<row_grid(rows), kReduceThreads, 0, on.stream>>>(
        static_cast<const D*>(x.raw_data()), static_cast<D*>(v.raw_data()),
        static_cast<int64_t*>(i.raw_data()), rows, n, op);
    GW_CUDA_CHECK_LAUNCH();
    write_back(v, values);
    write_back(i, indices);
  });
}

}  // namespace gw::cuda
