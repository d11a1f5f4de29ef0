// Sets the CUDA device of a tutti Device for a scope, and nothing for the
// CPU (or in builds without CUDA): the guard the layers' public entries
// open before they launch kernels, record events or call NCCL, because the
// calling thread (the reducer's bucket worker, an autograd hook) may be on
// any device -- a fresh thread is on device 0.
#pragma once

#include <optional>

#include "tutti/tensor.h"

#if TUTTI_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace tutti {

class ScopedDevice {
 public:
  explicit ScopedDevice(Device device) {
#if TUTTI_WITH_CUDA
    if (device.is_cuda()) guard_.emplace(device.index);
#else
    (void)device;
#endif
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
#if TUTTI_WITH_CUDA
  std::optional<cuda::DeviceGuard> guard_;
#endif
};

}  // namespace tutti
