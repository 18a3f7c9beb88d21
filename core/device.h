#pragma once
// Where a tensor's bytes live: the host (`cpu`) or one CUDA device (`cuda:N`).

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dt {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the host

  static constexpr Device CPU() { return {DeviceType::kCPU, 0}; }
  static constexpr Device CUDA(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string ToString() const;  // "cpu", "cuda:1"
};
inline constexpr Device kCPU = Device::CPU();

absl::StatusOr<Device> ParseDevice(absl::string_view text);  // "cpu", "cuda", "cuda:3"

// True when this binary was built with CUDA and a usable device is present at run time.
bool CudaAvailable();
// 0 without CUDA in the build, without a driver or without a device. Cheap where there is no
// NVIDIA driver: nothing is loaded (Note [CUDA module] in core/cuda_module.h).
int CudaDeviceCount();
// Why CudaDeviceCount() is 0, in words ("no NVIDIA driver (...)", a module load error, ...); empty
// when it is not.
std::string CudaUnavailableReason();

}  // namespace dt
