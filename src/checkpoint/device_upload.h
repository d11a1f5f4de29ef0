// Copies into CUDA tensors during a checkpoint load through two pinned
// staging buffers: while one buffer's bytes travel to the device
// (cudaMemcpyAsync on a stream of the destination's device), the loader
// reads the next chunk into the other.  The streams are blocking streams,
// ordered after earlier work on the legacy default stream as the
// synchronous cudaMemcpy they replace was.  finish() returns once every
// copy has landed, so the state is on the device when load returns, as
// before.  In a build without CUDA, copy() raises kUnsupported.
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "core/host_buffer.h"
#include "tutti/tensor.h"

namespace tutti {
namespace ckpt {

class DeviceUpload {
 public:
  static constexpr uint64_t kChunk = 16ull << 20;  // bytes per staging buffer

  explicit DeviceUpload(HostBufferPool& pool) : pool_(pool) {}
  // Waits for copies still in flight (errors ignored) and returns the
  // buffers to the pool.
  ~DeviceUpload();
  DeviceUpload(const DeviceUpload&) = delete;
  DeviceUpload& operator=(const DeviceUpload&) = delete;

  // The staging buffer to fill next (kChunk bytes), once the copies out of
  // its previous use have landed.
  unsigned char* buffer();
  // Queues a copy of n bytes at `from` (inside buffer()) to byte `dst_byte`
  // of the CUDA tensor `dst`.
  void copy(const Tensor& dst, uint64_t dst_byte, const unsigned char* from, size_t n);
  // Done filling buffer(): the next buffer() is the other one.
  void flip();
  // Waits until every queued copy is on the device.
  void finish();

 private:
  void wait_for(int b);
  void* stream(int device);

  HostBufferPool& pool_;
  HostBuffer buf_[2];
  int cur_ = 0;
  std::set<int> used_;           // devices copied to from buf_[cur_] since the flip
  std::set<int> pending_[2];     // devices whose event marks buf_[b]'s copies
  std::map<int, void*> streams_;             // device -> cudaStream_t
  std::map<int, void*> events_[2];           // device -> cudaEvent_t, per buffer
};

}  // namespace ckpt
}  // namespace tutti
