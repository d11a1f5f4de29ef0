#include "data_parallel/fusion_buffer.h"

#include <cstring>

#include "core/check.h"

namespace tutti {
namespace dp {

bool FusionBuffer::allocate(Device device, DType dtype, int64_t numel,
                            HostBufferPool& pool) {
  TUTTI_CHECK(data_ == nullptr, "fusion buffer allocated twice");
  device_ = device;
  dtype_ = dtype;
  numel_ = numel;
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  if (device.is_cpu()) {
    const size_t before = pool.allocations();
    host_ = pool.acquire(bytes);
    data_ = host_.data();
    if (bytes) std::memset(data_, 0, bytes);
    return pool.allocations() != before;
  }
#if TUTTI_WITH_CUDA
  dev_ = cuda::DeviceBuffer(device.index, bytes);
  data_ = dev_.data();
  if (bytes) {
    cuda::DeviceGuard g(device.index);
    TUTTI_CUDA_CHECK(cudaMemset(data_, 0, bytes));
  }
  return bytes > 0;
#else
  TUTTI_THROW(kUnsupported, "a gradient bucket on ", device.str(),
              " needs CUDA, but this build of tutti has none");
#endif
}

void FusionBuffer::release(HostBufferPool& pool) {
  if (device_.is_cpu() && host_.data()) pool.release(std::move(host_));
  free();
}

void FusionBuffer::free() {
  host_ = HostBuffer();
#if TUTTI_WITH_CUDA
  dev_ = cuda::DeviceBuffer();
#endif
  data_ = nullptr;
  numel_ = 0;
  borrowed_ = false;
}

void FusionBuffer::borrow(void* data, Device device, DType dtype, int64_t numel) {
  TUTTI_CHECK(borrowed_ || data_ == nullptr, "fusion buffer borrows over its own memory");
  device_ = device;
  dtype_ = dtype;
  numel_ = numel;
  data_ = data;
  borrowed_ = true;
}

void* FusionBuffer::at(int64_t offset) const {
  return static_cast<char*>(data_) + static_cast<size_t>(offset) * dtype_size(dtype_);
}

Tensor FusionBuffer::view(int64_t numel) const {
  TUTTI_CHECK_LE(numel, numel_);
  return Tensor(data_, dtype_, Shape{numel}, device_);
}

Tensor FusionBuffer::slice(int64_t offset, const Shape& shape) const {
  TUTTI_CHECK_LE(offset + shape.numel(), numel_);
  return Tensor(shape.numel() ? at(offset) : nullptr, dtype_, shape, device_);
}

void FusionBuffer::copy_in(int64_t offset, const Tensor& src, void* stream) {
  TUTTI_CHECK_LE(offset + src.numel(), numel_);
  if (src.nbytes() == 0) return;
  if (device_.is_cpu()) {
    std::memcpy(at(offset), src.data(), src.nbytes());
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(device_.index);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(at(offset), src.data(), src.nbytes(),
                                   cudaMemcpyDeviceToDevice,
                                   static_cast<cudaStream_t>(stream)));
#endif
}

void FusionBuffer::copy_out(int64_t offset, const Tensor& dst, void* stream) const {
  TUTTI_CHECK_LE(offset + dst.numel(), numel_);
  if (dst.nbytes() == 0) return;
  if (device_.is_cpu()) {
    std::memcpy(dst.data(), at(offset), dst.nbytes());
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(device_.index);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), at(offset), dst.nbytes(),
                                   cudaMemcpyDeviceToDevice,
                                   static_cast<cudaStream_t>(stream)));
#endif
}

void FusionBuffer::zero(int64_t offset, int64_t numel, void* stream) {
  TUTTI_CHECK_LE(offset + numel, numel_);
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype_);
  if (bytes == 0) return;
  if (device_.is_cpu()) {
    std::memset(at(offset), 0, bytes);
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(device_.index);
  TUTTI_CUDA_CHECK(cudaMemsetAsync(at(offset), 0, bytes,
                                   static_cast<cudaStream_t>(stream)));
#endif
}

std::unique_ptr<PoolSlot> make_pool_slot(Device device, int64_t bytes, HostBufferPool& pool) {
  std::unique_ptr<PoolSlot> slot(new PoolSlot);
  slot->mem.allocate(device, DType::kUInt8, bytes, pool);
#if TUTTI_WITH_CUDA
  if (device.is_cuda()) slot->released.reset(new cuda::Event(device.index));
#endif
  return slot;
}

void wait_released(PoolSlot& slot, Device device, void* stream) {
#if TUTTI_WITH_CUDA
  if (!slot.recorded) return;
  cuda::DeviceGuard g(device.index);
  TUTTI_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), slot.released->get(), 0));
#else
  (void)slot, (void)device, (void)stream;
#endif
}

void mark_released(PoolSlot& slot, Device device, void* stream) {
#if TUTTI_WITH_CUDA
  if (!slot.released) return;
  cuda::DeviceGuard g(device.index);
  slot.released->record(static_cast<cudaStream_t>(stream));
  slot.recorded = true;
#else
  (void)slot, (void)device, (void)stream;
#endif
}

#if TUTTI_WITH_CUDA
cuda::DeviceBuffer upload_to_device(int device, const void* host, size_t bytes) {
  cuda::DeviceBuffer b(device, bytes);
  if (bytes) {
    cuda::DeviceGuard g(device);
    cuda::copy_to_device_sync(b.data(), host, bytes);
  }
  return b;
}
#endif

}  // namespace dp
}  // namespace tutti
