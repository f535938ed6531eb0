// CUDA devices: how many there are and which one is current.
//
// device_count() is safe to call anywhere, also on a machine without a driver or GPU: it then
// returns 0 instead of throwing, so code and tests can ask before touching a device. Kernels
// run on the calling thread's current device; DeviceGuard switches it for a scope:
//
//   if (gw::cuda::is_available()) {
//     gw::cuda::DeviceGuard guard(1);   // cudaSetDevice(1), restored at scope exit
//     gw::Tensor x = gw::zeros({2}, gw::cuda_device(1));
//   }
#pragma once

#include <string>

#include "core/device.h"

namespace gw::cuda {

// Devices visible to this process; 0 without a driver, without a GPU, or when the driver
// fails to initialize (the reason is kept for no_device_reason()).
int device_count();
bool is_available();
// Why device_count() is 0, in one line ("" when a device exists).
std::string no_device_reason();

int current_device();
void set_device(int index);
// Blocks until all work on `index` (the current device when -1) has finished.
void synchronize(int index = -1);

// Throws InvalidArgumentError naming `what` unless 0 <= index < kMaxDevices.
void check_device_index(int index, const char* what);

// Throws a CudaError naming `op` unless `device` is a CUDA device that exists.
void check_device(Device device, const char* op);

// Makes `index` current for its lifetime and restores the previous device after; a no-op
// when it is current already (cudaSetDevice is not free).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace gw::cuda
