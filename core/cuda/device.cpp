#include "core/cuda/device.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "core/cuda/cuda_error.h"

namespace gw::cuda {

namespace {
struct DeviceInfo {
  int count = 0;
  std::string reason;
};

// Asked once: the answer cannot change while the process runs, and cudaGetDeviceCount
// initializes the driver, which is slow.
const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo i;
    int n = 0;
    cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      clear_last_error();
      i.reason = error_message(status, "cudaGetDeviceCount");
      return i;
    }
    i.count = n;
    if (n == 0) i.reason = "[cuda] no CUDA device is visible (cudaGetDeviceCount returned 0)";
    return i;
  }();
  return info;
}
}  // namespace

int device_count() { return device_info().count; }
bool is_available() { return device_count() > 0; }
std::string no_device_reason() { return device_info().reason; }

int current_device() {
  int index = 0;
  GW_CUDA_CHECK(cudaGetDevice(&index));
  return index;
}

void set_device(int index) { GW_CUDA_CHECK(cudaSetDevice(index)); }

void synchronize(int index) {
  DeviceGuard guard(index < 0 ? current_device() : index);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
}

void check_device(Device device, const char* op) {
  GW_CHECK(device.is_cuda(), InvalidArgumentError, "[", op, "] expected a CUDA device, got ",
           device);
  const int n = device_count();
  if (n == 0) {
    throw CudaError(detail::str("[", op, "] cannot use ", device, ": ", no_device_reason()));
  }
  GW_CHECK(device.index >= 0 && device.index < n, CudaError, "[", op, "] device ", device,
           " does not exist (", n, " CUDA device", n == 1 ? "" : "s", " visible)");
}

DeviceGuard::DeviceGuard(int index) {
  int current = current_device();
  if (current != index) {
    set_device(index);
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; restoring a device that worked before does not fail.
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) clear_last_error();
}

void check_device_index(int index, const char* what) {
  GW_CHECK(index >= 0 && index < kMaxDevices, InvalidArgumentError, "[", what, "] device ", index,
           " is outside [0, ", kMaxDevices, ")");
}

}  // namespace gw::cuda
