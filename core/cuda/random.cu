// Random fills and bernoulli. Element i of a call draws from Philox4x32-10 (a counter-based
// generator) with counter i and a key taken from the Generator, one 64-bit draw per call: the
// numbers depend only on the generator's state and the element's position, never on the
// launch shape, so a seed reproduces them. They differ from the CPU's stream (as PyTorch's do).
#include <numbers>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"
#include "core/random.h"

namespace gw::cuda {

namespace {

struct Bits4 {
  uint32_t x, y, z, w;
};

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
__device__ Bits4 philox(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

__device__ __forceinline__ uint64_t join(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
// [0, 1) with 53 random bits.
__device__ __forceinline__ double unit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

struct RandomParams {
  RandomKind kind;
  double a, b;
  uint64_t key;
  int64_t lo;      // RandInt
  uint64_t range;  // RandInt: high - low
};

template <typename T>
__global__ void random_kernel(T* out, int64_t n, RandomParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Bits4 r = philox(static_cast<uint64_t>(i), p.key);
    const double u = unit(join(r.x, r.y));
    switch (p.kind) {
      case RandomKind::Uniform: {
        // Rounding to a narrow type can reach b itself: [a, b) maps it back to a.
        const T v = cast<T>(p.a + (p.b - p.a) * u);
        out[i] = cast<double>(v) >= p.b ? cast<T>(p.a) : v;
        break;
      }
      case RandomKind::Normal: {
        // Box-Muller in double; 1 - u is in (0, 1], so the log stays finite.
        const double u2 = unit(join(r.z, r.w));
        const double radius = sqrt(-2.0 * log(1.0 - u));
        out[i] = cast<T>(p.a + p.b * radius * cos(2.0 * std::numbers::pi * u2));
        break;
      }
      case RandomKind::RandInt: {
        // Multiply-shift: the bias is at most range / 2^64.
        const uint64_t k = __umul64hi(join(r.x, r.y), p.range);
        out[i] = cast<T>(p.lo + static_cast<int64_t>(k));
        break;
      }
      case RandomKind::Bernoulli:
        out[i] = cast<T>(u < p.a ? 1.0f : 0.0f);
        break;
    }
  }
}

template <typename T>
__global__ void bernoulli_kernel(const T* prob, T* out, int64_t n, uint64_t key, ErrorSlot err) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const double p = cast<double>(prob[i]);
    if (!(p >= 0 && p <= 1)) {
      err.report(i);
      continue;
    }
    const Bits4 r = philox(static_cast<uint64_t>(i), key);
    out[i] = cast<T>(unit(join(r.x, r.y)) < p ? 1.0f : 0.0f);
  }
}

uint64_t draw_key(Generator& gen) {
  std::lock_guard lock(gen.mutex());
  return gen.next_u64();
}

}  // namespace

void CudaBackend::random(RandomKind kind, const Tensor& out, double a, double b, Generator& gen) {
  auto run = [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t n = out.numel();
    if (n == 0) return;
    OnDevice on(out);
    RandomParams p{kind, a, b, draw_key(gen), 0, 0};
    if (kind == RandomKind::RandInt) {
      p.lo = static_cast<int64_t>(a);
      p.range = static_cast<uint64_t>(static_cast<int64_t>(b) - p.lo);
    }
    Tensor o = contiguous_target(out);
    random_kernel<<<grid_for(n), kThreads, 0, on.stream>>>(static_cast<D*>(o.raw_data()), n, p);
    GW_CUDA_CHECK_LAUNCH();
    write_back(o, out);
  };
  switch (kind) {
    case RandomKind::Uniform:
      return dispatch<CudaFloatTypes>(out.dtype(), "uniform_", run);
    case RandomKind::Normal:
      return dispatch<CudaFloatTypes>(out.dtype(), "normal_", run);
    case RandomKind::RandInt:
      return dispatch<CudaNumericTypes>(out.dtype(), "randint", run);
    case RandomKind::Bernoulli:
      return dispatch<CudaAllTypes>(out.dtype(), "bernoulli", run);
  }
}

void CudaBackend::bernoulli(const Tensor& p, const Tensor& out, Generator& gen) {
  dispatch<CudaFloatTypes>(p.dtype(), "bernoulli", [&]<typename T>() {
    using D = cuda_type_t<T>;
    const int64_t n = out.numel();
    if (n == 0) return;
    OnDevice on(out);
    Tensor pc = p.contiguous();
    Tensor o = contiguous_target(out);
    ErrorFlag flag(out.device(), on.stream);
    bernoulli_kernel<<<grid_for(n), kThreads, 0, on.stream>>>(static_cast<const D*>(pc.raw_data()),
                                                              static_cast<D*>(o.raw_data()), n,
                                                              draw_key(gen), flag.slot());
    GW_CUDA_CHECK_LAUNCH();
    if (auto bad = flag.check()) {
      const double value = pc.reshape({-1}).select(0, *bad).item<double>();
      throw InvalidArgumentError(
          detail::str("[bernoulli] probability ", value, " at index ", *bad, " is outside [0, 1]"));
    }
    write_back(o, out);
  });
}

}  // namespace gw::cuda
