// ShardedOptimizer's checkpoint state (flat shards per bucket) and
// consolidate() (the whole master weights and state, per parameter).
#include <algorithm>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/zero/zero_impl.h"

namespace tutti {

using zero::Bucket;

namespace {

ShardInfo flat_shard(const Bucket& z) {
  ShardInfo s;
  s.global_shape = {z.layout.numel};
  s.flat = true;
  s.offset = z.shard.begin;
  s.group = "dp";
  return s;
}

}  // namespace

// Flat shards over each bucket's element range: the loader re-splits them
// for another world size (same bucket layout), so every rank gets exactly
// the elements [r*S', min((r+1)*S', N)) of the new split.
StateDict ShardedOptimizerImpl::state_dict() {
  StateDict out;
  const std::vector<std::string> names = zero::state_names(hyper_.kind);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& z = buckets_[i];
    const std::string prefix = opt_.name + "/b" + std::to_string(i) + "/";
    out.push_back({prefix + "master", z.master.view(z.owned), flat_shard(z)});
    for (size_t k = 0; k < z.states.size(); ++k)
      out.push_back({prefix + names[k], z.states[k].view(z.owned), flat_shard(z)});
  }
  out.push_back({opt_.name + "/step", Tensor(&steps_, DType::kInt64, Shape{1}), {}});
  return out;
}

// Every bucket's master weights and states gathered whole (allgatherv of
// the uneven shards), then viewed per parameter.
StateDict ShardedOptimizerImpl::consolidate() {
  wait_parameters();
  StateDict out;
  const std::vector<std::string> names = zero::state_names(hyper_.kind);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& z = buckets_[i];
    const BucketLayout& l = z.layout;
    cuda::OptionalDeviceGuard device(l.device);
    const int64_t s = z.shard.shard_numel;
    std::vector<int64_t> counts(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r)
      counts[static_cast<size_t>(r)] =
          std::min<int64_t>((r + 1) * s, l.numel) - std::min<int64_t>(r * s, l.numel);
    z.full_states.resize(z.states.size());
    if (!z.full_master.data()) z.full_master.allocate(l.device, DType::kFloat32, l.numel, pool_);
    for (auto& f : z.full_states)
      if (!f.data()) f.allocate(l.device, DType::kFloat32, l.numel, pool_);
    OpOptions o;
    o.name = opt_.name + " consolidate bucket " + std::to_string(i);
    reducer_.group()->allgatherv(z.master.view(z.owned), z.full_master.view(), counts, o);
    for (size_t k = 0; k < z.states.size(); ++k)
      reducer_.group()->allgatherv(z.states[k].view(z.owned), z.full_states[k].view(), counts,
                                   o);
    for (const BucketSlot& slot : l.slots) {
      out.push_back({slot.name, z.full_master.slice(slot.offset, slot.shape), {}});
      for (size_t k = 0; k < z.states.size(); ++k)
        out.push_back({slot.name + "/" + names[k], z.full_states[k].slice(slot.offset, slot.shape),
                       {}});
    }
  }
#if TUTTI_WITH_CUDA
  if (!buckets_.empty() && buckets_.front().layout.device.is_cuda()) {
    cuda::DeviceGuard g(buckets_.front().layout.device.index);
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
#endif
  out.push_back({opt_.name + "/step", Tensor(&steps_, DType::kInt64, Shape{1}), {}});
  return out;
}

}  // namespace tutti
