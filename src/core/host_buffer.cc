#include "core/host_buffer.h"

#include <cstdlib>
#include <new>

#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {

HostBuffer::HostBuffer(size_t bytes, bool pinned) : want_pinned_(pinned) {
  reserve(bytes);
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), pinned_(o.pinned_),
      want_pinned_(o.want_pinned_), pinned_device_(o.pinned_device_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    pinned_ = o.pinned_;
    want_pinned_ = o.want_pinned_;
    pinned_device_ = o.pinned_device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void HostBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_ && data_) return;
  release();
  if (bytes == 0) return;
#if TUTTI_WITH_CUDA
  // Page-locking needs a context: use one the process already has (pinned
  // memory is usable from every device under unified addressing), never
  // create one.  No active context yet: plain memory (copies still work).
  const int device = want_pinned_ ? cuda::device_with_active_context() : -1;
  if (device >= 0) {
    cuda::DeviceGuard g(device);
    if (cudaHostAlloc(&data_, bytes, cudaHostAllocPortable) == cudaSuccess) {
      bytes_ = bytes;
      pinned_ = true;
      pinned_device_ = device;
      return;
    }
    cudaGetLastError();
    data_ = nullptr;
  }
#endif
  // Round up to the alignment, as aligned_alloc requires.
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  if (!data_)
    TUTTI_THROW(kInvalidArgument, "cannot allocate ", bytes,
                " bytes of host memory");
  bytes_ = bytes;
  pinned_ = false;
}

void HostBuffer::release() {
  if (!data_) return;
#if TUTTI_WITH_CUDA
  if (pinned_) {
    try {
      cuda::DeviceGuard g(pinned_device_);  // not "whatever is current" (0)
      cudaFreeHost(data_);
    } catch (const Error&) {
    }
    data_ = nullptr;
    bytes_ = 0;
    return;
  }
#endif
  std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}

HostBuffer HostBufferPool::acquire(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].bytes() >= bytes &&
          (best == free_.size() || free_[i].bytes() < free_[best].bytes()))
        best = i;
    if (best != free_.size()) {
      HostBuffer b = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
    ++allocations_;
  }
  return HostBuffer(bytes, pinned_);
}

void HostBufferPool::release(HostBuffer&& buffer) {
  if (!buffer.data()) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(buffer));
}

size_t HostBufferPool::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

}  // namespace tutti
