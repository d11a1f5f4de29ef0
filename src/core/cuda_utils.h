// CUDA helpers for tutti's own code (never installed).  Everything except
// device_count_noexcept() requires TUTTI_WITH_CUDA.
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/check.h"

namespace tutti {
namespace cuda {

// Number of visible devices; 0 when there is no driver or no device.
int device_count_noexcept();

#if TUTTI_WITH_CUDA

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr,
                                   const char* file, int line);

// Sets the device for the lifetime of the guard and restores the previous.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// An owned non-blocking stream.
class Stream {
 public:
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An owned event without timing.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  // cudaEventQuery: true when complete; throws on error.
  bool query() const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Device memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void reset();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

// Device of a pointer (cudaPointerGetAttributes), -1 for host memory.
int pointer_device(const void* p);

// Called by every kernel launcher right after its launch (through
// TUTTI_LAUNCH_CHECK): raises the launch error, if any, with the launcher's
// file:line.  This is also where the device discipline is enforced: the
// launching thread must have set the device that `stream` belongs to.
void check_launch(cudaStream_t stream, const char* file, int line);

#endif  // TUTTI_WITH_CUDA

}  // namespace cuda
}  // namespace tutti

#if TUTTI_WITH_CUDA
#define TUTTI_CUDA_CHECK(expr)                                              \
  do {                                                                      \
    cudaError_t tutti_err_ = (expr);                                        \
    if (tutti_err_ != cudaSuccess)                                          \
      ::tutti::cuda::throw_cuda_error(tutti_err_, #expr, __FILE__, __LINE__); \
  } while (0)
// After every <<<...>>> launch, in the launcher: see check_launch().
#define TUTTI_LAUNCH_CHECK(stream) \
  ::tutti::cuda::check_launch((stream), __FILE__, __LINE__)
#endif
