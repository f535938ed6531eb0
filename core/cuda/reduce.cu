// Reductions (sum, prod, max, min) and max/min with indices.
//
// A contiguous input whose reduced dims are adjacent is read in place as (outer, r, inner):
// every output element reduces r values that are `inner` apart. Two kernels cover it, each
// able to spread one output's work over many blocks, so that the whole GPU streams the input
// however few outputs there are (a whole-tensor sum has one):
//   - inner == 1 (rows reduced along their length): a block per (row, chunk of the row);
//   - inner > 1 (a bias gradient: sum over the leading dims): a thread per output column,
//     coalesced across the column, with the r axis cut into chunks over grid.y.
// Split work leaves per-chunk partials in the accumulator type, which a second launch of the
// same kernel reduces. Other layouts are made contiguous with the reduced dims last first.
// Floating sums accumulate in double and integer sums in int64, as on the CPU.
#include <limits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

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
      if constexpr (std::is_same_v<A, bool>)
        return acc || v;
      else
        return acc + v;
    case ReduceOp::Prod:
      if constexpr (std::is_same_v<A, bool>)
        return acc && v;
      else
        return acc * v;
    default:
      return better(op, v, acc) ? v : acc;
  }
}

constexpr int kReduceThreads = 256;
constexpr int kWarp = kWarpSize;
// Rows of at most this many elements are reduced by one thread each.
constexpr int64_t kShortRow = 16;
// About this many threads keep every multiprocessor of a large GPU streaming (an H100 holds
// 2^18 at once). Rows take four times that, so that blocks come in several waves and the
// last wave's imbalance is small; column partials are a tensor's worth of traffic each, so
// columns take one wave.
constexpr int64_t kBusyThreads = int64_t{1} << 18;
constexpr int64_t kBusyRowThreads = int64_t{1} << 20;
// A thread reduces at least this many elements before the work is split further.
constexpr int64_t kPerThread = 16;

template <typename A>
__device__ __forceinline__ A shuffle_down(A v, int offset) {
  if constexpr (std::is_same_v<A, bool>) {
    return __shfl_down_sync(0xffffffffu, static_cast<int>(v), offset) != 0;
  } else {
    return __shfl_down_sync(0xffffffffu, v, offset);
  }
}

// The block's combined value, valid in thread 0.
template <typename A>
__device__ __forceinline__ A block_combine(ReduceOp op, A acc) {
  __shared__ A warp_values[kReduceThreads / kWarp];
  for (int off = kWarp / 2; off > 0; off >>= 1) acc = combine(op, acc, shuffle_down(acc, off));
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  if (lane == 0) warp_values[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = warp_values[lane < kReduceThreads / kWarp ? lane : 0];
    for (int off = kReduceThreads / kWarp / 2; off > 0; off >>= 1) {
      acc = combine(op, acc, shuffle_down(acc, off));
    }
  }
  return acc;
}

// out[row * chunks + c] = reduction of chunk c (grid.y) of row (grid.x) of a contiguous
// (rows, cols) x; a chunk is `chunk` elements long. With V > 1 the rows and chunks start on
// 16-byte boundaries and threads load V-element packs; several loads are in flight per thread.
template <typename T, typename A, typename O, int V>
__global__ void reduce_rows(const T* x, O* out, int64_t cols, int64_t chunk, ReduceOp op, A init) {
  const int64_t row = blockIdx.x;
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = begin + chunk < cols ? begin + chunk : cols;
  const T* p = x + row * cols;
  A acc = init;
  if constexpr (V > 1) {
    using P = Pack<T, V>;
    const P* packs = reinterpret_cast<const P*>(p);
    int64_t i = begin / V + threadIdx.x;
    const int64_t last = end / V;  // end is a multiple of V (cols is)
    // Four packs in flight, into four accumulators (four short dependency chains).
    A part[4] = {init, init, init, init};
    for (; i + 3 * kReduceThreads < last; i += 4 * kReduceThreads) {
      P in[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) in[u] = packs[i + u * kReduceThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int j = 0; j < V; ++j) part[u] = combine(op, part[u], cast<A>(in[u].v[j]));
      }
    }
    for (; i < last; i += kReduceThreads) {
      const P in = packs[i];
#pragma unroll
      for (int j = 0; j < V; ++j) part[0] = combine(op, part[0], cast<A>(in.v[j]));
    }
    acc = combine(op, combine(op, part[0], part[1]), combine(op, part[2], part[3]));
  } else {
    int64_t i = begin + threadIdx.x;
    for (; i + 3 * kReduceThreads < end; i += 4 * kReduceThreads) {
      const T v0 = p[i], v1 = p[i + kReduceThreads], v2 = p[i + 2 * kReduceThreads],
              v3 = p[i + 3 * kReduceThreads];
      acc = combine(op, acc, cast<A>(v0));
      acc = combine(op, acc, cast<A>(v1));
      acc = combine(op, acc, cast<A>(v2));
      acc = combine(op, acc, cast<A>(v3));
    }
    for (; i < end; i += kReduceThreads) acc = combine(op, acc, cast<A>(p[i]));
  }
  acc = block_combine(op, acc);
  if (threadIdx.x == 0) out[row * gridDim.y + blockIdx.y] = cast<O>(acc);
}

template <typename T, typename A, typename O>
__global__ void reduce_rows_thread(const T* x, O* out, int64_t rows, int64_t cols, ReduceOp op,
                                   A init) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += step) {
    A acc = init;
    for (int64_t i = 0; i < cols; ++i) acc = combine(op, acc, cast<A>(x[r * cols + i]));
    out[r] = cast<O>(acc);
  }
}

// For x of (outer, r, inner): out[(c * outer + o) * inner + j] reduces x[o, k, j] over the
// k of chunk c (grid.y), `chunk` long. Neighbouring threads read neighbouring columns.
template <typename T, typename A, typename O>
__global__ void reduce_columns(const T* x, O* out, int64_t outer, int64_t r, int64_t inner,
                               int64_t chunk, ReduceOp op, A init) {
  const int64_t columns = outer * inner;
  const int64_t c = blockIdx.y;
  const int64_t begin = c * chunk, end = begin + chunk < r ? begin + chunk : r;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < columns;
       col += step) {
    const int64_t o = col / inner, j = col % inner;
    const T* p = x + o * r * inner + j;
    A acc = init;
    int64_t k = begin;
    for (; k + 3 < end; k += 4) {
      const T v0 = p[k * inner], v1 = p[(k + 1) * inner], v2 = p[(k + 2) * inner],
              v3 = p[(k + 3) * inner];
      acc = combine(op, acc, cast<A>(v0));
      acc = combine(op, acc, cast<A>(v1));
      acc = combine(op, acc, cast<A>(v2));
      acc = combine(op, acc, cast<A>(v3));
    }
    for (; k < end; ++k) acc = combine(op, acc, cast<A>(p[k * inner]));
    out[c * columns + col] = cast<O>(acc);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Reduces the contiguous (outer, r, inner) x into the contiguous out (outer * inner), which
// the last pass writes in its own type O; partials between passes are in A.
template <typename T, typename A, typename O>
void reduce_contiguous(const T* x, O* out, int64_t outer, int64_t r, int64_t inner, ReduceOp op,
                       A init, const TensorOptions& scratch, cudaStream_t stream) {
  if (inner == 1 && r <= kShortRow) {
    reduce_rows_thread<<<grid_for(outer), kThreads, 0, stream>>>(x, out, outer, r, op, init);
    GW_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t outputs = outer * inner;
  // Chunks per output: enough for the GPU to be busy, each still worth a thread's while.
  const int64_t lanes = inner == 1 ? kReduceThreads : 1;  // threads per output and chunk
  const int64_t busy = inner == 1 ? kBusyRowThreads : kBusyThreads;
  int64_t chunks = std::clamp<int64_t>(busy / std::max<int64_t>(outputs * lanes, 1), 1,
                                       std::max<int64_t>(r / (lanes * kPerThread), 1));
  chunks = std::min<int64_t>(chunks, 65535);  // grid.y's limit, and a bound on the scratch
  // Packs when every row starts on a 16-byte boundary; chunks are then whole packs.
  constexpr int kVec = kVecWidth<T>;
  const bool packed = inner == 1 && r % kVec == 0 && aligned16(x);
  const int64_t chunk = packed ? ceil_div(ceil_div(r, chunks), kVec) * kVec : ceil_div(r, chunks);
  chunks = ceil_div(r, chunk);
  // One chunk: straight into out. Several: partials first, then another pass over them.
  Tensor partial;
  if (chunks > 1) partial = empty({chunks * outputs}, scratch.with_dtype(dtype_of_v<A>));
  auto* dst = static_cast<A*>(chunks > 1 ? partial.raw_data() : nullptr);
  if (inner == 1) {
    GW_CHECK(outer < (int64_t{1} << 31), InvalidArgumentError, "[cuda reduce] ", outer,
             " rows exceed the grid");
    const dim3 grid(static_cast<unsigned>(outer), static_cast<unsigned>(chunks));
    auto launch = [&]<typename D, int V>(D* to) {
      reduce_rows<T, A, D, V><<<grid, kReduceThreads, 0, stream>>>(x, to, r, chunk, op, init);
    };
    if (chunks == 1) {
      packed ? launch.template operator()<O, kVec>(out) : launch.template operator()<O, 1>(out);
    } else {
      packed ? launch.template operator()<A, kVec>(dst) : launch.template operator()<A, 1>(dst);
    }
    GW_CUDA_CHECK_LAUNCH();
    // Partials are laid out (row, chunk): reduce each row's chunks.
    if (chunks > 1)
      reduce_contiguous<A, A, O>(dst, out, outer, chunks, 1, op, init, scratch, stream);
  } else {
    const auto blocks =
        static_cast<unsigned>(std::min<int64_t>(ceil_div(outputs, kThreads), kMaxBlocks));
    const dim3 grid(blocks, static_cast<unsigned>(chunks));
    if (chunks == 1) {
      reduce_columns<<<grid, kThreads, 0, stream>>>(x, out, outer, r, inner, chunk, op, init);
    } else {
      reduce_columns<<<grid, kThreads, 0, stream>>>(x, dst, outer, r, inner, chunk, op, init);
    }
    GW_CUDA_CHECK_LAUNCH();
    // Partials are laid out (chunk, output): reduce over the chunks.
    if (chunks > 1)
      reduce_contiguous<A, A, O>(dst, out, 1, chunks, outputs, op, init, scratch, stream);
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
__global__ void arg_reduce_rows(const T* x, T* values, int64_t* indices, int64_t rows, int64_t cols,
                                ReduceOp op) {
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
  // (outer, r, inner) in place when `in` is contiguous and the reduced dims are adjacent.
  int64_t outer = rows, inner = 1;
  Tensor x = in;
  const bool adjacent = !reduced.empty() && reduced.back() - reduced.front() + 1 ==
                                                static_cast<int64_t>(reduced.size());
  if (in.is_contiguous() && adjacent) {
    outer = 1;
    for (int64_t d = 0; d < reduced.front(); ++d) outer *= in.size(d);
    inner = rows / outer;
  } else if (cols > 0) {
    x = rows_layout(in, kept, reduced);
  }
  OnDevice on(out);
  dispatch<CudaAllTypes>(in.dtype(), "reduce", [&]<typename T>() {
    using D = cuda_type_t<T>;
    auto run = [&]<typename A>() {
      const A init = reduce_identity<A>(op);
      if (cols == 0) {
        fill(out, Scalar(init));
        return;
      }
      auto into = [&]<typename O>(O* to) {
        reduce_contiguous<D, A, O>(static_cast<const D*>(x.raw_data()), to, outer, cols, inner, op,
                                   init, out.options(), on.stream);
      };
      // The last pass writes `out` itself when it is contiguous and of the input's or the
      // accumulator's type (a float32 sum, an int64 count); otherwise an accumulator buffer
      // is converted into it.
      if (out.is_contiguous() && out.dtype() == in.dtype()) {
        into(static_cast<D*>(out.raw_data()));
      } else if (out.is_contiguous() && out.dtype() == dtype_of_v<A>) {
        into(static_cast<A*>(out.raw_data()));
      } else {
        Tensor acc = empty(out.sizes(), out.options().with_dtype(dtype_of_v<A>));
        into(static_cast<A*>(acc.raw_data()));
        copy_on_device(acc, out);
      }
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
