// Where a tensor's memory lives. Every tensor has a Device; operations dispatch on it through
// the Backend of its DeviceType (core/backend.h: core/cpu/ or core/cuda/).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace gw {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}  // NOLINT: implicit on purpose
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
// CUDA devices a process can address by index: per-device tables are arrays of this size.
inline constexpr int kMaxDevices = 64;
inline Device cuda_device(int index = 0) { return Device(DeviceType::CUDA, index); }

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace gw
