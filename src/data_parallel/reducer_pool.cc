// Pooled bucket buffers (Reducer::set_bucket_collective with
// pooled_buffers > 0): a bucket's full-size buffer exists only from its
// first write in a reducing pass until its collective has completed.  See
// the protocol in reducer_impl.h.
#include <algorithm>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/reducer_impl.h"

namespace tutti {

using dp::Bucket;

namespace {

int64_t padded_bytes(const Bucket& b, int64_t world) {
  const BucketLayout& l = b.plan.layout;
  return (l.numel + world - 1) / world * world * static_cast<int64_t>(dtype_size(l.dtype));
}

}  // namespace

// Between steps: every bucket's own buffer is freed (not pooled: the point
// is to give the memory back) and `buffers` slots of the largest padded
// bucket are allocated - unless those would take as much memory as the
// buckets' own buffers (few buckets, or one much larger than the rest):
// then nothing changes.
void ReducerImpl::install_pool(int buffers) {
  int64_t largest = 0, all = 0;
  for (const Bucket& b : buckets_) {
    largest = std::max(largest, padded_bytes(b, group_->size()));
    all += padded_bytes(b, group_->size());
  }
  if (buffers * largest >= all) return;
  pool_slot_bytes_ = largest;
  for (Bucket& b : buckets_) b.buffer->free();
  for (int i = 0; i < buffers; ++i) free_slots_.push_back(add_pool_slot());
}

// Between steps: the pool is freed and every bucket gets its own (zeroed)
// buffer again.
void ReducerImpl::remove_pool() {
  for (Bucket& b : buckets_) {
    b.buffer->free();
    b.pool_slot = -1;
    if (b.buffer->allocate(b.plan.layout.device, b.plan.layout.dtype,
                           padded_bytes(b, group_->size()) /
                               static_cast<int64_t>(dtype_size(b.plan.layout.dtype)),
                           pool_))
      ++stats_.buffer_allocations;
  }
  pool_slots_.clear();
  free_slots_.clear();
  pool_slot_bytes_ = 0;
}

int ReducerImpl::add_pool_slot() {
  pool_slots_.push_back(
      dp::make_pool_slot(buckets_.front().plan.layout.device, pool_slot_bytes_, pool_));
  ++stats_.buffer_allocations;
  return static_cast<int>(pool_slots_.size()) - 1;
}

// Before every write into `b` in this pass (on `stream`).
void ReducerImpl::acquire_buffer(Bucket& b, void* stream) {
  if (!pooled()) return;
  if (b.pool_slot >= 0) {
    // Held already: a write from another stream than the one that took the
    // buffer (b.stream, set after the first write) must also wait for the
    // buffer's last release, or it could land while the previous borrower's
    // collective still reads the memory.  The event still marks that
    // release: it is recorded again only when `b` gives the buffer back.
    if (b.plan.layout.device.is_cuda() && b.stream_set && stream != b.stream)
      dp::wait_released(*pool_slots_[static_cast<size_t>(b.pool_slot)], b.plan.layout.device,
                        stream);
    return;
  }
  if (free_slots_.empty()) {
    // The oldest launched bucket holding a buffer (one chain: launch order
    // is bucket order) gives it back once its collective is done.
    for (Bucket& old : buckets_) {
      if (old.pool_slot < 0 || !old.issued) continue;
      if (old.work) {
        cuda::OptionalDeviceGuard device(old.plan.layout.device);
        WorkPtr work = std::move(old.work);
        work->wait();
      }
      release_buffer(old);
      ++stats_.pool_waits;
      break;
    }
  }
  if (free_slots_.empty()) {
    // Every buffer is held by a bucket still being filled (gradients out of
    // bucket order): nothing to wait for, so the pool grows.
    free_slots_.push_back(add_pool_slot());
    ++stats_.pool_growths;
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  dp::PoolSlot& slot = *pool_slots_[static_cast<size_t>(s)];
  const BucketLayout& l = b.plan.layout;
  const int64_t padded = padded_bytes(b, group_->size()) / static_cast<int64_t>(dtype_size(l.dtype));
  dp::wait_released(slot, l.device, stream);
  b.buffer->borrow(slot.mem.data(), l.device, l.dtype, padded);
  b.pool_slot = s;
  // Every slot of the bucket is written before its launch; the padding
  // must read as zeros.
  b.buffer->zero(l.numel, padded - l.numel, stream);
}

// After b's collective was waited for (its Work made b.stream wait).
void ReducerImpl::release_buffer(Bucket& b) {
  if (b.pool_slot < 0) return;
  dp::mark_released(*pool_slots_[static_cast<size_t>(b.pool_slot)], b.plan.layout.device,
                    b.stream);
  free_slots_.push_back(b.pool_slot);
  b.pool_slot = -1;
  b.buffer->free();
}

int64_t ReducerImpl::bucket_bytes() const {
  if (pooled()) return static_cast<int64_t>(pool_slots_.size()) * pool_slot_bytes_;
  int64_t bytes = 0;
  for (const Bucket& b : buckets_)
    if (b.buffer) bytes += b.buffer->numel() * static_cast<int64_t>(dtype_size(b.plan.layout.dtype));
  return bytes;
}

}  // namespace tutti
