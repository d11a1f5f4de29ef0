// Where a tensor's memory lives: host memory or one CUDA device.
#pragma once

#include <string>

#include "tutti/export.h"

namespace tutti {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int index) {
    return Device{DeviceType::kCUDA, index};
  }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const {
    return type == o.type && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
  // "cpu" or "cuda:N".
  TUTTI_API std::string str() const;
  // Parses "cpu", "cuda", "cuda:N".  Throws kInvalidArgument otherwise.
  TUTTI_API static Device parse(const std::string& s);
};

// True when this build of tutti was compiled with CUDA support.
TUTTI_API bool cuda_built();
// Number of CUDA devices visible to this process (0 without CUDA support, a
// driver or a device).  Never throws.
TUTTI_API int cuda_device_count();

}  // namespace tutti
