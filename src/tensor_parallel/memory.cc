#include "tensor_parallel/memory.h"

#include <cstring>

#include "core/check.h"

namespace tutti {
namespace tp {

namespace {
#if TUTTI_WITH_CUDA
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
#else
[[noreturn]] void no_cuda(const char* what, Device device) {
  TUTTI_THROW(kUnsupported, what, " on ", device.str(),
              ": this build of tutti has no CUDA support");
}
#endif
}  // namespace

OwnedTensor::OwnedTensor(DType dtype, Shape shape, Device device) {
  reshape(dtype, shape, device);
}

Tensor OwnedTensor::reshape(DType dtype, Shape shape, Device device) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* data = nullptr;
  if (device.is_cuda()) {
#if TUTTI_WITH_CUDA
    if (device_buffer_.bytes() < bytes ||
        device_buffer_.device() != device.index)
      device_buffer_ = cuda::DeviceBuffer(device.index, bytes);
    data = device_buffer_.data();
#else
    no_cuda("a tensor-parallel buffer", device);
#endif
  } else {
    host_.reserve(bytes);
    data = host_.data();
  }
  tensor_ = Tensor(bytes == 0 ? nullptr : data, dtype, shape, device);
  return tensor_;
}

Tensor Workspace::get(int slot, DType dtype, Shape shape, Device device) {
  TUTTI_CHECK(slot >= 0, "workspace slot ", slot);
  if (static_cast<size_t>(slot) >= slots_.size()) slots_.resize(slot + 1);
  return slots_[slot].reshape(dtype, shape, device);
}

void fill_zero(const Tensor& t, void* stream) {
  if (t.numel() == 0) return;
  if (t.is_cuda()) {
#if TUTTI_WITH_CUDA
    cuda::DeviceGuard g(t.device().index);
    TUTTI_CUDA_CHECK(
        cudaMemsetAsync(t.data(), 0, t.nbytes(), as_stream(stream)));
    return;
#else
    no_cuda("fill_zero", t.device());
#endif
  }
  std::memset(t.data(), 0, t.nbytes());
}

void copy_from_host(const Tensor& dst, const void* src) {
  if (dst.numel() == 0) return;
  if (dst.is_cuda()) {
#if TUTTI_WITH_CUDA
    cuda::DeviceGuard g(dst.device().index);
    // Landed when it returns: the layers' streams may be non-blocking
    // (parameter loading, not the hot path).
    cuda::copy_to_device_sync(dst.data(), src, dst.nbytes());
    return;
#else
    no_cuda("a host-to-device copy", dst.device());
#endif
  }
  std::memcpy(dst.data(), src, dst.nbytes());
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard g(device.index);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
#else
  no_cuda("synchronize", device);
#endif
}

void copy_to_host(void* dst, const Tensor& src) {
  if (src.numel() == 0) return;
  if (src.is_cuda()) {
#if TUTTI_WITH_CUDA
    cuda::DeviceGuard g(src.device().index);
    TUTTI_CUDA_CHECK(
        cudaMemcpy(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost));
    return;
#else
    no_cuda("a device-to-host copy", src.device());
#endif
  }
  std::memcpy(dst, src.data(), src.nbytes());
}

void copy_tensor(const Tensor& dst, const Tensor& src, void* stream) {
  TUTTI_CHECK_EQ(dst.nbytes(), src.nbytes(), "copy ", src.str(), " -> ",
                 dst.str());
  if (dst.data() == src.data() || dst.numel() == 0) return;
  copy_2d(dst.data(), dst.nbytes(), src.data(), src.nbytes(), src.nbytes(), 1,
          dst.device(), stream);
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
             size_t width, size_t height, Device device, void* stream) {
  if (width == 0 || height == 0) return;
  if (device.is_cuda()) {
#if TUTTI_WITH_CUDA
    cuda::DeviceGuard g(device.index);
    TUTTI_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width,
                                       height, cudaMemcpyDeviceToDevice,
                                       as_stream(stream)));
    return;
#else
    no_cuda("a copy", device);
#endif
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t r = 0; r < height; ++r)
    std::memcpy(d + r * dst_pitch, s + r * src_pitch, width);
}

}  // namespace tp
}  // namespace tutti
