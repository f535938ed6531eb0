#include "core/backend.h"

#include "core/cpu/cpu_backend.h"

#include <algorithm>
#include <array>
#include <atomic>

namespace gw {

namespace {
std::array<std::atomic<Backend*>, kNumDeviceTypes>& registry() {
  static std::array<std::atomic<Backend*>, kNumDeviceTypes> backends{};
  return backends;
}
}  // namespace

void register_backend(DeviceType type, Backend* backend) {
  registry()[static_cast<size_t>(type)].store(backend, std::memory_order_release);
}

Backend& backend_for(DeviceType type, const char* op) {
  if (type == DeviceType::CPU) return cpu::cpu_backend();
  Backend* b = registry()[static_cast<size_t>(type)].load(std::memory_order_acquire);
  GW_CHECK(b != nullptr, InvalidArgumentError, "[", op, "] no backend for device ",
           Device(type).str(), " in this build");
  return *b;
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

void Backend::adam_step(std::span<const AdamParam>, const AdamUpdate&) {
  throw InternalError(detail::str("[adam_step] the backend of ", Device(device_type()),
                                  " has no fused Adam kernel"));
}

bool is_float_only(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp: case UnaryOp::Log: case UnaryOp::Sqrt: case UnaryOp::Rsqrt:
    case UnaryOp::Sigmoid: case UnaryOp::Tanh: case UnaryOp::Gelu: case UnaryOp::GeluTanh:
    case UnaryOp::Sin: case UnaryOp::Cos: case UnaryOp::Reciprocal: case UnaryOp::Log1p:
    case UnaryOp::Expm1: case UnaryOp::Erf:
      return true;
    default:
      return false;
  }
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

const char* op_name(UnaryOp op) {
  static constexpr const char* kNames[] = {
      "neg",  "abs",  "exp",         "log",    "sqrt",       "rsqrt", "sigmoid", "tanh",
      "relu", "gelu", "gelu",        "sin",    "cos",        "sign",  "logical_not",
      "square", "reciprocal", "log1p", "expm1", "floor", "ceil", "round", "erf"};
  return kNames[static_cast<size_t>(op)];
}

const char* op_name(BinaryOp op) {
  static constexpr const char* kNames[] = {"add", "sub", "mul", "div", "pow", "maximum",
                                           "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                                           "logical_and", "logical_or"};
  return kNames[static_cast<size_t>(op)];
}

}  // namespace gw
