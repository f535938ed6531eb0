#include "core/backend.h"

#include "core/cpu/cpu_backend.h"

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
