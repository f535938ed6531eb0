// index_select, gather and scatter_add. Indices were bounds-checked by the front end, except
// where checking needs the values themselves (done here, naming the op and the index).
#include <cstring>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/half_as_float.h"

namespace gw::cpu {

namespace {

// Visits every position of `shape` in row-major order, keeping element offsets for up to
// three strided tensors in step: f(offsets) with offsets[k] the element offset in tensor k.
template <size_t N, typename F>
void for_each_position(const Shape& shape, const std::array<const Shape*, N>& strides, F&& f) {
  const int64_t total = numel(shape);
  if (total == 0) return;
  const size_t nd = shape.size();
  std::vector<int64_t> coord(nd, 0);
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(coord, off);
    for (size_t d = nd; d-- > 0;) {
      for (size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
      if (++coord[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * shape[d];
      coord[d] = 0;
    }
  }
}

void check_index(const char* op, int64_t idx, int64_t size, int64_t dim) {
  GW_CHECK(idx >= 0 && idx < size, IndexError, "[", op, "] index ", idx,
           " is out of range for dim ", dim, " of size ", size);
}

}  // namespace

void CpuBackend::index_select(const Tensor& in, int64_t dim, const Tensor& index,
                              const Tensor& out) {
  Tensor x = in.contiguous();
  Tensor idx = index.contiguous();
  const int64_t n = x.size(dim);
  int64_t inner = 1, outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t count = idx.numel();
  const size_t block = inner * x.element_size();
  const int64_t* pi = idx.data_ptr<int64_t>();
  const char* px = static_cast<const char*>(x.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  for (int64_t j = 0; j < count; ++j) check_index("index_select", pi[j], n, dim);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(po + (o * count + j) * block, px + (o * n + pi[j]) * block, block);
    }
  }
}

void CpuBackend::gather(const Tensor& in, int64_t dim, const Tensor& index, const Tensor& out) {
  dispatch<CopyTypes>(in.dtype(), "gather", [&]<typename T>() {  // moves: 16-bit types too
    const T* px = static_cast<const T*>(in.raw_data());
    const int64_t* pi = static_cast<const int64_t*>(index.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const int64_t n = in.size(dim), in_stride = in.stride(dim);
    Shape in_strides = in.strides();
    in_strides[dim] = 0;  // the coordinate along dim comes from the index instead
    for_each_position<3>(index.sizes(), {&index.strides(), &in_strides, &out.strides()},
                         [&](const std::vector<int64_t>&, const std::array<int64_t, 3>& off) {
      int64_t j = pi[off[0]];
      check_index("gather", j, n, dim);
      po[off[2]] = px[off[1] + j * in_stride];
    });
  });
}

void CpuBackend::scatter_add(const Tensor& self, int64_t dim, const Tensor& index,
                             const Tensor& src) {
  if (in_float32(
          {&index, &src}, {&self}, [&](const auto& t) { scatter_add(t[2], dim, t[0], t[1]); },
          Written::accumulated))
    return;
  dispatch<NumericTypes>(self.dtype(), "scatter_add", [&]<typename T>() {
    T* ps = static_cast<T*>(self.raw_data());
    const int64_t* pi = static_cast<const int64_t*>(index.raw_data());
    const T* pv = static_cast<const T*>(src.raw_data());
    const int64_t n = self.size(dim), self_stride = self.stride(dim);
    Shape self_strides = self.strides();
    self_strides[dim] = 0;
    for_each_position<3>(index.sizes(), {&index.strides(), &self_strides, &src.strides()},
                         [&](const std::vector<int64_t>&, const std::array<int64_t, 3>& off) {
      int64_t j = pi[off[0]];
      check_index("scatter_add", j, n, dim);
      ps[off[1] + j * self_stride] += pv[off[2]];
    });
  });
}

}  // namespace gw::cpu
