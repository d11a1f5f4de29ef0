// ShardedOptimizer: the update and the parameter all-gather, bucket by
// bucket, with the all-gather buffers owned per bucket (overlap_all_gather,
// gather_buffers = 0) or borrowed from a pool.  See zero_impl.h.
#include "compression/cast.h"
#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/zero/zero_impl.h"

namespace tutti {

using zero::Bucket;

// Bucket by bucket, last bucket first: take a gather buffer, write this
// rank's rounded master weights into its block (optim::step's model copies
// while updating the shard, or a cast of the loaded master weights when
// `hyper` is null), launch one in-place all-gather.  Buckets are formed in
// reverse registration order, so the last bucket holds the first layers,
// which the next forward pass needs first (every rank launches in this same
// order).  Owned buffers: everything is launched before the first wait.
// Pooled: a bucket finding the pool empty first finishes the oldest bucket
// in flight (wait, write its parameters, give its buffer back).
void ShardedOptimizerImpl::launch_gathers(void* stream, const optim::Hyper* hyper,
                                          float grad_scale) {
  wait_parameters();  // the previous step's all-gathers (overlap_all_gather)
  gather_stream_ = stream;
  for (size_t i = buckets_.size(); i-- > 0;) {
    Bucket& z = buckets_[i];
    cuda::OptionalDeviceGuard device(z.layout.device);
    acquire_gather(i, stream);
    const int64_t s = z.shard.shard_numel;
    if (hyper && !z.step_params.empty()) {
      optim::step(z.step_params, z.step_grads, z.step_states, *hyper, grad_scale, z.step_copies,
                  stream, z.step_names);
    } else if (!hyper && z.owned > 0) {
      compression::cast_convert(z.layout.device, z.master.data(), DType::kFloat32,
                                z.gather.at(z.shard.begin), z.layout.dtype, z.owned, 1.f,
                                stream);
    }
    z.gather_pending = true;
    if (world_ == 1) continue;
    OpOptions o;
    o.name = opt_.name + " gather bucket " + std::to_string(i);
    o.stream = stream;
    z.gather_work = reducer_.group()->allgather_async(
        z.gather.view().slice(rank_ * s, rank_ * s + s), z.gather.view(), o);
  }
}

void ShardedOptimizerImpl::acquire_gather(size_t b, void* stream) {
  Bucket& z = buckets_[b];
  // Still held: a step that failed between here and its all-gather.
  if (!gather_pooled() || z.gather_slot >= 0) return;
  if (gather_free_.empty()) {
    // The oldest bucket in flight: launched first, i.e. the highest index.
    for (size_t o = buckets_.size(); o-- > b + 1;)
      if (buckets_[o].gather_slot >= 0) {
        finish_gather(o);
        break;
      }
  }
  TUTTI_CHECK(!gather_free_.empty(), "ShardedOptimizer '", opt_.name,
              "': no all-gather buffer free for bucket ", b, " (pool of ", gather_pool_.size(),
              ")");
  const int slot = gather_free_.back();
  gather_free_.pop_back();
  dp::PoolSlot& p = *gather_pool_[static_cast<size_t>(slot)];
  dp::wait_released(p, z.layout.device, stream);
  z.gather.borrow(p.mem.data(), z.layout.device, z.layout.dtype, z.shard.shard_numel * world_);
  z.gather_slot = slot;
  for (size_t k = 0; k < z.step_copies.size(); ++k)
    z.step_copies[k] = z.gather.view().slice(z.copy_ranges[k].first, z.copy_ranges[k].second);
}

// After the parameters were written from z.gather (on gather_stream_).
void ShardedOptimizerImpl::release_gather(Bucket& z) {
  if (z.gather_slot < 0) return;
  dp::mark_released(*gather_pool_[static_cast<size_t>(z.gather_slot)], z.layout.device,
                    gather_stream_);
  gather_free_.push_back(z.gather_slot);
  z.gather_slot = -1;
  z.gather.free();
}

// Waits for bucket b's all-gather and writes its parameters from it.
void ShardedOptimizerImpl::finish_gather(size_t b) {
  Bucket& z = buckets_[b];
  if (!z.gather_pending) return;
  cuda::OptionalDeviceGuard device(z.layout.device);
  WorkPtr work = std::move(z.gather_work);
  z.gather_pending = false;
  if (work) work->wait();
  if (z.layout.device.is_cpu()) {
    dp::unflatten_scale_cpu(z.gather.data(), z.layout.dtype, z.chunks.data(), z.chunks.size(),
                            1);
    release_gather(z);
    return;
  }
#if TUTTI_WITH_CUDA
  kernels::launch_unflatten_scale(
      z.gather.data(), z.layout.dtype,
      static_cast<const kernels::UnflattenChunk*>(z.device_chunks.data()),
      static_cast<int>(z.chunks.size()), 1, static_cast<cudaStream_t>(gather_stream_));
#endif
  release_gather(z);
}

void ShardedOptimizerImpl::wait_parameters() {
  for (size_t b = buckets_.size(); b-- > 0;) finish_gather(b);
}

void ShardedOptimizerImpl::wait_parameter(int index) {
  TUTTI_ARG_CHECK(index >= 0 && index < static_cast<int>(param_bucket_.size()),
                  "ShardedOptimizer '", opt_.name, "': wait_parameter(", index,
                  "): no such parameter (", param_bucket_.size(), " registered)");
  // Buckets finish in launch order (the earlier all-gathers complete first
  // anyway), so a forward pass may ask in any order.
  const size_t mine = static_cast<size_t>(param_bucket_[static_cast<size_t>(index)]);
  for (size_t b = buckets_.size(); b-- > mine;) finish_gather(b);
}

void ShardedOptimizerImpl::write_parameters(void* stream) {
  launch_gathers(stream, nullptr, 1.f);
  wait_parameters();
}

int64_t ShardedOptimizerImpl::gather_bytes() const {
  if (gather_pooled()) return static_cast<int64_t>(gather_pool_.size()) * gather_slot_bytes_;
  int64_t bytes = 0;
  for (const Bucket& z : buckets_)
    bytes += z.gather.numel() * static_cast<int64_t>(dtype_size(z.layout.dtype));
  return bytes;
}

}  // namespace tutti
