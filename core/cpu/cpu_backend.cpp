// CPU memory, copies, fills and random numbers; registers the CPU backend at load time.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/half_as_float.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/cpu/cpu_allocator.h"
#include "core/cpu/loops.h"
#include "core/random.h"

namespace gw::cpu {

namespace {

// The block size rides in the deleter's context pointer, so freeing needs no lookup.
void free_cpu_block(void* ctx, void* ptr) {
  free_block(ptr, static_cast<size_t>(reinterpret_cast<uintptr_t>(ctx)));
}

}  // namespace

namespace {
// Tensors of a few elements (scalars, per-op constants) keep their bytes inside the Storage
// object: one allocation instead of two on the hottest path of small ops.
constexpr size_t kInlineBytes = 64;
struct InlineStorage : Storage {
  alignas(std::max_align_t) unsigned char bytes[kInlineBytes];  // malloc alignment: no memalign
  InlineStorage(size_t nbytes, Device device) : Storage(bytes, nbytes, device, Deleter{}) {}
};
}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

std::shared_ptr<Storage> CpuBackend::allocate(size_t nbytes, Device device) {
  if (nbytes <= kInlineBytes) return std::make_shared<InlineStorage>(nbytes, device);
  void* p = alloc_block(nbytes);
  return std::make_shared<Storage>(
      p, nbytes, device, Deleter{&free_cpu_block, reinterpret_cast<void*>(uintptr_t{nbytes})});
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  GW_CHECK(src.device().is_cpu() && dst.device().is_cpu(), InvalidArgumentError,
           "[copy] the CPU backend cannot copy from ", src.device(), " to ", dst.device());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  dispatch<CopyTypes>(dst.dtype(), "copy", [&]<typename D>() {
    dispatch<CopyTypes>(src.dtype(), "copy", [&]<typename S>() {
      for_each_row<2>(dst.sizes(), {&dst, &src}, [](auto& p, auto& s, int64_t n) {
        if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
          auto* d = reinterpret_cast<D*>(p[0]);
          auto* x = reinterpret_cast<const S*>(p[1]);
          for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(x[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            *reinterpret_cast<D*>(p[0] + i * s[0]) =
                convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
          }
        }
      });
    });
  });
}

void CpuBackend::fill(const Tensor& dst, const Scalar& value) {
  // Every storable dtype directly: a fill only stores (no float32 round trip for 16-bit ones).
  dispatch<CopyTypes>(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = value.to<T>();
    for_each_row<1>(dst.sizes(), {&dst}, [v](auto& p, auto& s, int64_t n) {
      if (s[0] == sizeof(T)) {
        std::fill_n(reinterpret_cast<T*>(p[0]), n, v);
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

void CpuBackend::iota(const Tensor& out, double start, double step) {
  if (in_float32({}, {&out}, [&](const auto& t) { iota(t[0], start, step); })) return;
  dispatch<NumericTypes>(out.dtype(), "arange", [&]<typename T>() {
    T* p = out.data_ptr<T>();
    for (int64_t i = 0, n = out.numel(); i < n; ++i) p[i] = static_cast<T>(start + i * step);
  });
}

void CpuBackend::random(RandomKind kind, const Tensor& out, double a, double b,
                        Generator& gen) {
  if (in_float32({}, {&out}, [&](const auto& t) { random(kind, t[0], a, b, gen); })) {
    // A float32 draw just below b may round to b in 16 bits: mapped to a, as above.
    if (kind == RandomKind::Uniform) {
      dispatch<TypeList<Half, BFloat16>>(out.dtype(), "uniform_", [&]<typename T>() {
        for_each_row<1>(out.sizes(), {&out}, [&](auto& p, auto& s, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            T& v = *reinterpret_cast<T*>(p[0] + i * s[0]);
            if (convert<float>(v) >= b) v = convert<T>(static_cast<float>(a));
          }
        });
      });
    }
    return;
  }
  std::lock_guard lock(gen.mutex());
  // Always serial and in row-major order: the numbers must not depend on the thread count.
  auto fill_with = [&]<typename T>(auto draw) {
    std::array<const Tensor*, 1> ts{&out};
    Operands<1> ops = collapse<1>(out.sizes(), ts);
    if (out.numel() == 0) return;
    int64_t rows = numel(ops.shape) / ops.shape.back();
    auto row = [&](auto& p, auto& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = draw();
    };
    run_rows(ops, 0, rows, row);
  };
  switch (kind) {
    case RandomKind::Uniform:
      dispatch<FloatTypes>(out.dtype(), "uniform_", [&]<typename T>() {
        // a + (b - a) u rounds to b for some u < 1: [a, b) maps it to a, as the GPU's kernel does.
        fill_with.template operator()<T>([&] {
          if constexpr (std::is_same_v<T, float>) {
            const float v = static_cast<float>(a + (b - a) * gen.next_float());
            return v >= static_cast<float>(b) ? static_cast<float>(a) : v;
          } else {
            const double v = a + (b - a) * gen.next_double();
            return v >= b ? a : v;
          }
        });
      });
      break;
    case RandomKind::Normal:
      dispatch<FloatTypes>(out.dtype(), "normal_", [&]<typename T>() {
        fill_with.template operator()<T>([&] { return static_cast<T>(a + b * gen.next_normal()); });
      });
      break;
    case RandomKind::RandInt:
      dispatch<NumericTypes>(out.dtype(), "randint", [&]<typename T>() {
        auto lo = static_cast<int64_t>(a);
        auto range = static_cast<uint64_t>(static_cast<int64_t>(b) - lo);
        fill_with.template operator()<T>(
            [&] { return static_cast<T>(lo + static_cast<int64_t>(gen.next_below(range))); });
      });
      break;
    case RandomKind::Bernoulli:
      dispatch<AllTypes>(out.dtype(), "bernoulli", [&]<typename T>() {
        fill_with.template operator()<T>([&] { return static_cast<T>(gen.next_double() < a); });
      });
      break;
  }
}

void CpuBackend::bernoulli(const Tensor& p, const Tensor& out, Generator& gen) {
  if (in_float32({&p}, {&out}, [&](const auto& t) { bernoulli(t[0], t[1], gen); })) return;
  std::lock_guard lock(gen.mutex());
  dispatch<FloatTypes>(p.dtype(), "bernoulli", [&]<typename T>() {
    Tensor pc = p.contiguous();
    const T* prob = pc.data_ptr<T>();
    T* o = out.data_ptr<T>();
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
      GW_CHECK(prob[i] >= 0 && prob[i] <= 1, InvalidArgumentError,
               "[bernoulli] probability ", prob[i], " at index ", i, " is outside [0, 1]");
      o[i] = static_cast<T>(gen.next_double() < prob[i]);
    }
  });
}

}  // namespace gw::cpu
