#include "core/backend.h"

#include "core/cpu/cpu_backend.h"
#ifdef GW_HAVE_CUDA
#include "core/cuda/cuda_backend.h"
#endif

#include <algorithm>

namespace gw {

Backend& backend_for(DeviceType type, const char* op) {
  switch (type) {
    case DeviceType::CPU:
      return cpu::cpu_backend();
    case DeviceType::CUDA:
#ifdef GW_HAVE_CUDA
      return cuda::cuda_backend();
#else
      break;
#endif
  }
  throw InvalidArgumentError(detail::str("[", op, "] no backend for device ", Device(type).str(),
                                         " in this build (gradwire was built without CUDA)"));
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    GW_CHECK(t->device() == first->device(), InvalidArgumentError, "[", op,
             "] expected all tensors on one device, got ", first->device(), " and ", t->device());
  }
}

void check_writable(const char* op, const Tensor& out) {
  if (out.numel() == 0) return;  // nothing is written
  for (int64_t d = 0; d < out.dim(); ++d) {
    GW_CHECK(out.stride(d) != 0 || out.size(d) <= 1, InvalidArgumentError, "[", op,
             "] cannot write to an expanded tensor (shape ", shape_str(out.sizes()), ", strides ",
             shape_str(out.strides()),
             "): several of its elements are one place in memory; "
             "clone() it first");
  }
}

void Backend::addmm(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  throw InternalError(
      detail::str("[addmm] the backend of ", Device(device_type()), " has no fused addmm"));
}

void Backend::unary_backward(UnaryOp op, const Tensor&, const Tensor&, const Tensor&) {
  throw InternalError(detail::str("[", op_name(op), "] the backend of ", Device(device_type()),
                                  " has no fused derivative kernel for it"));
}

void Backend::attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const AttentionOptions&, const Tensor&, const Tensor&) {
  throw InternalError(detail::str("[scaled_dot_product_attention] the backend of ",
                                  Device(device_type()), " has no fused attention kernel"));
}

void Backend::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const AttentionOptions&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  throw InternalError(detail::str("[scaled_dot_product_attention] the backend of ",
                                  Device(device_type()), " has no fused attention kernel"));
}

void Backend::adam_step(std::span<const AdamParam>, const AdamUpdate&) {
  throw InternalError(detail::str("[adam_step] the backend of ", Device(device_type()),
                                  " has no fused Adam kernel"));
}

MatrixView classify_matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // The stride of a size-1 dim is never used, so it does not constrain the layout.
  const int64_t r = std::max<int64_t>(rows, 1), c = std::max<int64_t>(cols, 1);
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= c))
    return {MatrixLayout::RowMajor, rows <= 1 ? c : row_stride};
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= r))
    return {MatrixLayout::ColMajor, cols <= 1 ? r : col_stride};
  return {MatrixLayout::Copy, 0};
}

Conv2dGeometry conv2d_geometry(const Tensor& x, const std::array<int64_t, 8>& p) {
  Conv2dGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), p[0], p[1], p[2], p[3],
                   p[4],      p[5],      p[6],      p[7],      0,    0};
  g.oh = conv_output_size(g.h, g.kh, g.sh, g.ph, g.dh);
  g.ow = conv_output_size(g.w, g.kw, g.sw, g.pw, g.dw);
  return g;
}

}  // namespace gw
