// im2col / col2im. Each (channel, kernel offset) row of the column matrix is filled from one
// shifted, strided window of the input plane, so the inner loop walks output columns.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/half_as_float.h"
#include "core/parallel.h"

namespace gw::cpu {

namespace {

// Calls f(x_offset_in_plane or -1 for padding, col_index) for every entry of one column row.
template <typename F>
void for_each_tap(const Conv2dGeometry& g, int64_t ki, int64_t kj, F&& f) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t y = oy * g.sh - g.ph + ki * g.dh;
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const int64_t xx = ox * g.sw - g.pw + kj * g.dw;
      const bool inside = y >= 0 && y < g.h && xx >= 0 && xx < g.w;
      f(inside ? y * g.w + xx : -1, oy * g.ow + ox);
    }
  }
}

}  // namespace

void CpuBackend::unfold2d(const Tensor& x_in, const std::array<int64_t, 8>& params,
                          const Tensor& cols) {
  if (in_float32({&x_in}, {&cols}, [&](const auto& t) { unfold2d(t[0], params, t[1]); })) return;
  Tensor x = x_in.contiguous();
  const Conv2dGeometry g = conv2d_geometry(x, params);
  dispatch<FloatTypes>(x.dtype(), "unfold", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* pc = cols.data_ptr<T>();
    const int64_t plane = g.h * g.w, L = g.oh * g.ow;
    parallel_for(0, g.n * g.c, 1, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const T* src = px + nc * plane;
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            T* row = pc + (nc * g.kh * g.kw + ki * g.kw + kj) * L;
            for_each_tap(g, ki, kj, [&](int64_t off, int64_t col) {
              row[col] = off >= 0 ? src[off] : T(0);
            });
          }
        }
      }
    });
  });
}

void CpuBackend::fold2d(const Tensor& cols_in, const std::array<int64_t, 8>& params,
                        const Tensor& x) {
  if (in_float32({&cols_in}, {&x}, [&](const auto& t) { fold2d(t[0], params, t[1]); })) return;
  Tensor cols = cols_in.contiguous();
  const Conv2dGeometry g = conv2d_geometry(x, params);
  dispatch<FloatTypes>(x.dtype(), "fold", [&]<typename T>() {
    const T* pc = cols.data_ptr<T>();
    T* px = x.data_ptr<T>();
    const int64_t plane = g.h * g.w, L = g.oh * g.ow;
    std::fill_n(px, x.numel(), T(0));
    // Each (n, c) plane is written only by its own rows: planes run in parallel safely.
    parallel_for(0, g.n * g.c, 1, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        T* dst = px + nc * plane;
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const T* row = pc + (nc * g.kh * g.kw + ki * g.kw + kj) * L;
            for_each_tap(g, ki, kj, [&](int64_t off, int64_t col) {
              if (off >= 0) dst[off] += row[col];
            });
          }
        }
      }
    });
  });
}

}  // namespace gw::cpu
