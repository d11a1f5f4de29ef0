#include "core/cuda_utils.h"

#include <atomic>
#include <cstring>

#include "tutti/config.h"

#if TUTTI_WITH_CUDA
#include <cudaTypedefs.h>  // driver function-pointer types only; no libcuda link
#endif

namespace tutti {
namespace cuda {

// ---- device discipline: pure pieces -----------------------------------------

namespace {
thread_local int t_guard_device = -1;
}  // namespace

int thread_device() { return t_guard_device; }

ThreadDeviceScope::ThreadDeviceScope(int device) : saved_(t_guard_device) {
  t_guard_device = device;
}

ThreadDeviceScope::~ThreadDeviceScope() { t_guard_device = saved_; }

bool should_restore_device(int previous, int device, ContextState previous_context) {
  return previous >= 0 && previous != device && previous_context == ContextState::kActive;
}

std::string device_rule_violation(int guard_device, int current, int stream_device,
                                  bool require_guard) {
  if (require_guard && guard_device < 0)
    return detail::cat("this thread has not set its device through tutti (no "
                       "cuda::DeviceGuard is live; current device ", current,
                       ", stream on device ", stream_device,
                       "): a thread's current device is 0 until it sets one");
  if (guard_device >= 0 && current != guard_device)
    return detail::cat("the current device is ", current, " but the innermost "
                       "cuda::DeviceGuard set ", guard_device,
                       " (cudaSetDevice called inside the guard?)");
  if (stream_device != current)
    return detail::cat("the stream belongs to device ", stream_device,
                       " but the current device is ", current);
  return std::string();
}

bool device_check_enabled() {
  // Cached per settings generation: one atomic load per launch.
  static std::atomic<uint64_t> generation{0};
  static std::atomic<bool> enabled{false};
  const uint64_t g = config::generation();
  if (generation.load(std::memory_order_acquire) != g) {
    enabled.store(config::get_bool("TUTTI_CHECK_DEVICE"), std::memory_order_relaxed);
    generation.store(g, std::memory_order_release);
  }
  return enabled.load(std::memory_order_relaxed);
}

#if TUTTI_WITH_CUDA

int device_count_noexcept() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void throw_cuda_error(cudaError_t err, const char* expr, const char* file,
                      int line) {
  const char* base = std::strrchr(file, '/');
  detail::throw_error(ErrorCode::kCuda, file, line,
                      detail::cat(expr, " failed: ", cudaGetErrorName(err), " (",
                                  cudaGetErrorString(err), ") at ",
                                  base ? base + 1 : file, ":", line));
}

// ---- driver entry points (looked up at run time) ------------------------------

namespace {

struct DriverApi {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_state = nullptr;
};

void* driver_symbol(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // The ABI of both symbols as of CUDA 12.0 (unchanged since they appeared).
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    a.device_get = reinterpret_cast<PFN_cuDeviceGet_v2000>(driver_symbol("cuDeviceGet"));
    a.primary_ctx_state = reinterpret_cast<PFN_cuDevicePrimaryCtxGetState_v7000>(
        driver_symbol("cuDevicePrimaryCtxGetState"));
    return a;
  }();
  return api;
}

}  // namespace

ContextState primary_context_state(int device) {
  const DriverApi& api = driver();
  if (device < 0 || !api.device_get || !api.primary_ctx_state) return ContextState::kUnknown;
  CUdevice dev = 0;
  if (api.device_get(&dev, device) != CUDA_SUCCESS) return ContextState::kUnknown;
  unsigned int flags = 0;
  int active = 0;
  if (api.primary_ctx_state(dev, &flags, &active) != CUDA_SUCCESS)
    return ContextState::kUnknown;
  return active ? ContextState::kActive : ContextState::kInactive;
}

int device_with_active_context() {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (primary_context_state(current) == ContextState::kActive) return current;
  const int n = device_count_noexcept();
  for (int d = 0; d < n; ++d)
    if (d != current && primary_context_state(d) == ContextState::kActive) return d;
  return -1;
}

// ---- DeviceGuard ------------------------------------------------------------

namespace {

// Makes `device` current; returns the device that was current.
int switch_device(int device) {
  int previous = -1;
  TUTTI_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device) TUTTI_CUDA_CHECK(cudaSetDevice(device));
  return previous;
}

}  // namespace

DeviceGuard::DeviceGuard(int device)
    : previous_(switch_device(device)), device_(device), scope_(device) {}

DeviceGuard::~DeviceGuard() {
  if (previous_ == device_) return;
  int now = -1;
  if (cudaGetDevice(&now) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (now == previous_) return;
  if (should_restore_device(previous_, now, primary_context_state(previous_)))
    cudaSetDevice(previous_);
}

// ---- Stream, Event, DeviceBuffer --------------------------------------------

Stream::Stream(int device, int priority) : device_(device) {
  DeviceGuard g(device);
  TUTTI_CUDA_CHECK(
      cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (!stream_) return;
  try {
    DeviceGuard g(device_);
    cudaStreamDestroy(stream_);
  } catch (const Error&) {  // the device is gone: nothing left to free
  }
}

Event::Event() {
  if (device_check_enabled() && thread_device() < 0)
    TUTTI_THROW(kInternal, "cuda::Event created on a thread that has not set its "
                "device through tutti (no cuda::DeviceGuard is live), so it "
                "would belong to whatever device is current (0 on a fresh thread)");
  TUTTI_CUDA_CHECK(cudaGetDevice(&device_));
  create();
}

Event::Event(int device) : device_(device) {
  DeviceGuard g(device);
  create();
}

void Event::create() {
  TUTTI_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

Event::~Event() {
  if (!event_) return;
  try {
    DeviceGuard g(device_);
    cudaEventDestroy(event_);
  } catch (const Error&) {
  }
}

void Event::record(cudaStream_t stream) {
  DeviceGuard g(device_);
  TUTTI_CUDA_CHECK(cudaEventRecord(event_, stream));
}

bool Event::query() const {
  DeviceGuard g(device_);
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  TUTTI_CUDA_CHECK(e);
  return false;
}

DeviceBuffer::DeviceBuffer(int device, size_t bytes)
    : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  DeviceGuard g(device);
  TUTTI_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), device_(o.device_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_) {
    // Under a guard, never a bare "set it back": on a fresh thread the
    // previous device is 0, and setting it would create a context there.
    try {
      DeviceGuard g(device_);
      cudaFree(data_);
    } catch (const Error&) {
    }
  }
  data_ = nullptr;
  bytes_ = 0;
}

void copy_to_device_sync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  TUTTI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

int pointer_device(const void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged
             ? attr.device
             : -1;
}

// ---- check_launch -------------------------------------------------------------

namespace {

// "" when the calling thread's devices obey the rule for `stream`, or when
// the runtime cannot say.
std::string launch_violation(cudaStream_t stream, bool require_guard) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return std::string();
  }
  int stream_device = current;  // the null / legacy / per-thread stream
#if CUDART_VERSION >= 12080
  if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread &&
      cudaStreamGetDevice(stream, &stream_device) != cudaSuccess) {
    cudaGetLastError();
    stream_device = current;
  }
#else
  (void)stream;
#endif
  return device_rule_violation(thread_device(), current, stream_device, require_guard);
}

}  // namespace

void check_launch(cudaStream_t stream, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  const bool strict = device_check_enabled();
  if (err == cudaSuccess && !strict) return;
  const std::string why = launch_violation(stream, strict);
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  if (err != cudaSuccess) {
    if (why.empty()) throw_cuda_error(err, "kernel launch", file, line);
    detail::throw_error(ErrorCode::kCuda, file, line,
                        detail::cat("kernel launch failed: ", cudaGetErrorName(err),
                                    " (", cudaGetErrorString(err), ") at ", base,
                                    ":", line, "; device discipline: ", why));
  }
  if (!why.empty())  // kInternal: throw_error appends the launcher's file:line
    detail::throw_error(ErrorCode::kInternal, file, line,
                        detail::cat("kernel launch broke the device discipline "
                                    "(TUTTI_CHECK_DEVICE): ", why));
}

#else  // !TUTTI_WITH_CUDA

int device_count_noexcept() { return 0; }

#endif

}  // namespace cuda
}  // namespace tutti
