// A bucket's flat buffer on the host or on a CUDA device, and the copies the
// reducer makes into and out of it.  CUDA copies are asynchronous on the
// given stream (a cudaStream_t); host copies are plain memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/host_buffer.h"
#include "tutti/tensor.h"

#if TUTTI_WITH_CUDA
#include "core/cuda_utils.h"
#endif

namespace tutti {
namespace dp {

class FusionBuffer {
 public:
  FusionBuffer() = default;
  FusionBuffer(FusionBuffer&&) = default;
  FusionBuffer& operator=(FusionBuffer&&) = default;

  // `numel` zeroed elements of `dtype` on `device`; host memory comes from
  // `pool` (reused across rebuilds).  Returns true when it allocated fresh
  // memory (for the allocation statistics).
  bool allocate(Device device, DType dtype, int64_t numel, HostBufferPool& pool);
  // Gives host memory back to the pool (device memory is freed).
  void release(HostBufferPool& pool);
  // Frees the memory outright (host memory is not kept in a pool), or
  // forgets borrowed memory.
  void free();
  // Views `numel` elements of `dtype` at `data`, memory owned elsewhere (a
  // pooled bucket buffer, Reducer::set_bucket_collective); nothing is
  // allocated or zeroed.  Ends with free() (or another borrow()).
  void borrow(void* data, Device device, DType dtype, int64_t numel);
  bool borrowed() const { return borrowed_; }

  void* data() const { return data_; }
  Device device() const { return device_; }
  int64_t numel() const { return numel_; }
  // The first `numel` elements as a tensor.
  Tensor view(int64_t numel) const;
  Tensor view() const { return view(numel_); }
  // Elements [offset, offset + shape.numel()) as a tensor of `shape`.
  Tensor slice(int64_t offset, const Shape& shape) const;
  // The address of element `offset`.
  void* at(int64_t offset) const;

  // buffer[offset, offset + src.numel()) = src.
  void copy_in(int64_t offset, const Tensor& src, void* stream);
  // dst = buffer[offset, offset + dst.numel()).
  void copy_out(int64_t offset, const Tensor& dst, void* stream) const;
  // buffer[offset, offset + numel) = 0.
  void zero(int64_t offset, int64_t numel, void* stream);

 private:
  Device device_ = Device::cpu();
  DType dtype_ = DType::kFloat32;
  int64_t numel_ = 0;
  void* data_ = nullptr;
  bool borrowed_ = false;
  HostBuffer host_;
#if TUTTI_WITH_CUDA
  cuda::DeviceBuffer dev_;
#endif
};

// A buffer that buckets borrow in turn (the reducer's pooled bucket
// buffers, the sharded optimizer's all-gather buffers).
struct PoolSlot {
  FusionBuffer mem;
#if TUTTI_WITH_CUDA
  // Recorded on the stream of the last borrower once it is done with the
  // memory; the next borrower's stream waits for it before writing.
  std::unique_ptr<cuda::Event> released;
  bool recorded = false;
#endif
};

// `bytes` bytes on `device` (host memory from `pool`).
std::unique_ptr<PoolSlot> make_pool_slot(Device device, int64_t bytes, HostBufferPool& pool);
// The next borrower, writing on `stream`, waits for the last release.
void wait_released(PoolSlot& slot, Device device, void* stream);
// The borrower is done with the memory once `stream` gets here.
void mark_released(PoolSlot& slot, Device device, void* stream);

#if TUTTI_WITH_CUDA
// A device copy of `bytes` host bytes (a chunk table), made once at build.
cuda::DeviceBuffer upload_to_device(int device, const void* host, size_t bytes);
#endif

}  // namespace dp
}  // namespace tutti
