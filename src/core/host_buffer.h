// Owned host memory for tutti's internal buffers (fusion buffers, staging,
// checkpoint snapshots): 64-byte aligned, optionally page-locked (pinned)
// when CUDA is available so device copies can be asynchronous.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace tutti {

class HostBuffer {
 public:
  HostBuffer() = default;
  // pinned: cudaHostAlloc through a device whose primary context is already
  // active (the current one first), so pinning never creates a context;
  // plain aligned memory when CUDA is not built or no context exists yet
  // (pinned() then reports false).
  explicit HostBuffer(size_t bytes, bool pinned = false);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  void reserve(size_t bytes);

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  bool want_pinned_ = false;
  int pinned_device_ = -1;  // the context that page-locked it
};

// A pool of host buffers reused across steps, so the hot path does not
// allocate once it has warmed up.  acquire() returns a buffer of at least
// `bytes` (the smallest free one that fits, else a new one); release()
// returns it.  Thread-safe.
class HostBufferPool {
 public:
  explicit HostBufferPool(bool pinned = false) : pinned_(pinned) {}
  HostBuffer acquire(size_t bytes);
  void release(HostBuffer&& buffer);
  size_t free_count() const;
  size_t allocations() const { return allocations_; }

 private:
  mutable std::mutex mu_;
  std::vector<HostBuffer> free_;
  bool pinned_;
  size_t allocations_ = 0;
};

}  // namespace tutti
