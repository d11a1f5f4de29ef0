#include "core/cuda_utils.h"

#include <cstring>

namespace tutti {
namespace cuda {

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

DeviceGuard::DeviceGuard(int device) {
  TUTTI_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) TUTTI_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_ && previous_ >= 0)
    cudaSetDevice(previous_);
}

Stream::Stream(int device, int priority) {
  DeviceGuard g(device);
  TUTTI_CUDA_CHECK(
      cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}

Event::Event() {
  TUTTI_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) {
  TUTTI_CUDA_CHECK(cudaEventRecord(event_, stream));
}

bool Event::query() const {
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
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    cudaFree(data_);
    if (prev >= 0) cudaSetDevice(prev);
  }
  data_ = nullptr;
  bytes_ = 0;
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

void check_launch(cudaStream_t, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, "kernel launch", file, line);
}

#else

int device_count_noexcept() { return 0; }

#endif

}  // namespace cuda
}  // namespace tutti
