// CUDA helpers for tutti's own code (never installed).  The device-discipline
// bookkeeping and decisions are plain C++ and exist in every build (so the
// CPU tests reach them); everything else requires TUTTI_WITH_CUDA.
//
// Device discipline (docs/architecture.md): every thread that launches CUDA
// work, records or waits on events, or calls NCCL sets the device of the
// tensor or stream it works on through a DeviceGuard, and no guard ever
// creates a context on a device the process does not use.
#pragma once

#include <optional>
#include <string>

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/check.h"
#include "tutti/device.h"
#include "tutti/export.h"

namespace tutti {
namespace cuda {

// Number of visible devices; 0 when there is no driver or no device.
int device_count_noexcept();

// ---- device discipline: pure pieces -----------------------------------------

// The device set by the innermost live DeviceGuard of the calling thread, or
// -1 when no guard is live (tutti has not set this thread's device).
TUTTI_API int thread_device();

// The bookkeeping half of DeviceGuard: thread_device() is `device` for the
// scope and what it was before afterwards.  No CUDA call.
class TUTTI_API ThreadDeviceScope {
 public:
  explicit ThreadDeviceScope(int device);
  ~ThreadDeviceScope();
  ThreadDeviceScope(const ThreadDeviceScope&) = delete;
  ThreadDeviceScope& operator=(const ThreadDeviceScope&) = delete;

 private:
  int saved_;
};

// What the driver says about a device's primary context.
enum class ContextState { kActive, kInactive, kUnknown };

// Whether a guard that set `device` makes `previous` current again when it
// ends.  Only when that cannot create a context: cudaSetDevice initialises
// the primary context (CUDA 12+), so a fresh thread's "previous = 0" would
// cost ~500 MiB on GPU 0 per process.  Restores iff previous is a device
// other than `device` whose primary context is known to be active; otherwise
// the thread simply stays on `device`.
bool should_restore_device(int previous, int device, ContextState previous_context);

// check_launch's verdict on a launch from a thread whose innermost guard set
// `guard_device` (-1: none), whose current device is `current`, onto a stream
// of `stream_device`: "" when the rule holds, else the reason.
// `require_guard` false checks only that the devices match.
std::string device_rule_violation(int guard_device, int current, int stream_device,
                                  bool require_guard);

// TUTTI_CHECK_DEVICE (re-read after config::reload()).
bool device_check_enabled();

#if TUTTI_WITH_CUDA

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr,
                                   const char* file, int line);

// The driver's view of `device`'s primary context, through
// cudaGetDriverEntryPointByVersion (libtutti does not link libcuda, so it
// loads on machines without a driver); kUnknown when unavailable.  Creates
// no context.
ContextState primary_context_state(int device);

// A device whose primary context is already active: the calling thread's
// current device if it is one, else the lowest; -1 when the process has no
// active context (or the driver cannot say).
int device_with_active_context();

// Sets `device` for the guard's lifetime (thread_device() reports it); at the
// end makes the previous device current again only where that creates no
// context (should_restore_device).  Exported for the Python bindings.
class TUTTI_API DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int device_;
  ThreadDeviceScope scope_;
};

#endif  // TUTTI_WITH_CUDA

// A DeviceGuard for CUDA devices, nothing for the CPU (and nothing in builds
// without CUDA).
class OptionalDeviceGuard {
 public:
  explicit OptionalDeviceGuard(Device device) {
#if TUTTI_WITH_CUDA
    if (device.is_cuda()) guard_.emplace(device.index);
#else
    (void)device;
#endif
  }
  OptionalDeviceGuard(const OptionalDeviceGuard&) = delete;
  OptionalDeviceGuard& operator=(const OptionalDeviceGuard&) = delete;

 private:
#if TUTTI_WITH_CUDA
  std::optional<DeviceGuard> guard_;
#endif
};

#if TUTTI_WITH_CUDA

// An owned non-blocking stream on `device`; destroyed under a guard.
class Stream {
 public:
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_;
};

// An owned event without timing, on one device; record, query and destroy
// run under a guard for that device.
class Event {
 public:
  // On the calling thread's current device, which must have been set
  // through a DeviceGuard (enforced when device_check_enabled()).
  Event();
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  void record(cudaStream_t stream);
  // cudaEventQuery: true when complete; throws on error.
  bool query() const;

 private:
  void create();
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

// Device memory; freed under a guard for its device.
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

// Copies `bytes` from host memory to the device and returns once they are
// there.  A plain cudaMemcpy from pageable memory returns once the bytes
// are staged, possibly before the DMA lands (CUDA's "API synchronization
// behavior"), and a kernel on a non-blocking stream could then read the old
// bytes: this one also waits for the legacy default stream that carries the
// DMA.  For set-up paths (checkpoint loads, initial states), not hot loops.
// The caller holds a guard for the destination's device.  Exported for the
// Python bindings.
TUTTI_API void copy_to_device_sync(void* dst, const void* src, size_t bytes);

// Called by every kernel launcher right after its launch (through
// TUTTI_LAUNCH_CHECK): raises the launch error, if any, with the launcher's
// file:line.  With device_check_enabled() it also enforces the device
// discipline: the launching thread must be inside a DeviceGuard, and the
// guard's device, the current device and `stream`'s device must agree (a
// null or legacy stream belongs to the current device); a violation is
// kInternal.  A failed launch names a device mismatch in its message either
// way.
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
