// Memory the tensor-parallel layers own: parameters, gradients and scratch.
//
// The caller owns activations (inputs, outputs, their gradients); a layer
// owns its parameter shards, their gradients, and grow-only scratch for the
// intermediate tensors a forward or backward pass needs.  Scratch is reused
// across steps, so the hot path allocates only while sizes still grow.
#pragma once

#include <vector>

#include "core/cuda_utils.h"
#include "core/host_buffer.h"
#include "tutti/tensor.h"

namespace tutti {
namespace tp {

// Host or device memory for one tensor.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  // Uninitialised storage of `shape` elements of `dtype` on `device`.
  OwnedTensor(DType dtype, Shape shape, Device device);
  OwnedTensor(OwnedTensor&&) noexcept = default;
  OwnedTensor& operator=(OwnedTensor&&) noexcept = default;

  const Tensor& tensor() const { return tensor_; }
  // Grows the storage when needed and returns a view of `shape`.  Contents
  // are not kept across a growth.
  Tensor reshape(DType dtype, Shape shape, Device device);

 private:
  HostBuffer host_;
#if TUTTI_WITH_CUDA
  cuda::DeviceBuffer device_buffer_;
#endif
  Tensor tensor_;
};

// Numbered scratch slots; get() returns a view valid until the next get() of
// the same slot.  Not thread-safe: one pass of one layer at a time.  On CUDA
// the memory is reused by later work on the same stream, which stream order
// makes safe; work on other streams must use its own Workspace.
class Workspace {
 public:
  Tensor get(int slot, DType dtype, Shape shape, Device device);

 private:
  std::vector<OwnedTensor> slots_;
};

// Zeroes a tensor (cudaMemsetAsync on `stream` for CUDA tensors).
void fill_zero(const Tensor& t, void* stream);
// Copies host memory into `dst` (host or device) and waits until the copy
// has landed, so `src` may be released and any stream may read `dst`.
void copy_from_host(const Tensor& dst, const void* src);
// Waits for all work on a CUDA device (no-op for the CPU).
void synchronize(Device device);
// Copies `src` (host or device) into host memory (waits for the copy).
void copy_to_host(void* dst, const Tensor& src);
// Copies between two tensors of the same bytes on the same device.
void copy_tensor(const Tensor& dst, const Tensor& src, void* stream);
// height rows of width bytes from src (row pitch src_pitch) to dst (row
// pitch dst_pitch), on the device of `device` (cudaMemcpy2DAsync on
// `stream` for CUDA).
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
             size_t width, size_t height, Device device, void* stream);

}  // namespace tp
}  // namespace tutti
