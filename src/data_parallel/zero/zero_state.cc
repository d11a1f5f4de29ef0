// ShardedOptimizer's checkpoint state (flat shards per bucket) and
// consolidate() (the whole master weights and state, per parameter).
#include <algorithm>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/zero/zero_impl.h"

namespace tutti {

using zero::Bucket;

// Per parameter, not per bucket: entry "<name>/<param>/master" (and
// "/<state>") is the flattened parameter's float32 array, of which this rank
// holds the piece its shards cover (ShardInfo::flat at the piece's offset;
// an empty tensor where it owns none).  So a checkpoint does not depend on
// the bucket plan it was cut from (the learned order re-plans the buckets
// after the first step, and a fresh job loads before its reducer has
// re-planned) nor on the world size: the loader hands every rank exactly
// the elements of its own pieces.
StateDict ShardedOptimizerImpl::state_dict() {
  StateDict out;
  const std::vector<std::string> names = zero::state_names(hyper_.kind);
  static float none = 0.f;  // the data of the empty entries (never read)
  for (int pi = 0; pi < reducer_.num_parameters(); ++pi) {
    const int64_t numel = reducer_.parameter(pi).numel();
    const Bucket& z = buckets_[static_cast<size_t>(param_bucket_[static_cast<size_t>(pi)])];
    const zero::Piece* piece = nullptr;
    for (const zero::Piece& p : z.pieces)
      if (p.param == pi) piece = &p;
    ShardInfo info;
    info.global_shape = {numel};
    info.flat = true;
    info.group = "dp";
    std::string name;
    for (size_t s = 0; s < z.slot_params.size(); ++s)
      if (z.slot_params[s] == pi) name = z.layout.slots[s].name;
    auto entry = [&](const std::string& what, const dp::FusionBuffer& buf) {
      Tensor t(&none, DType::kFloat32, Shape{0});
      if (piece) {
        const int64_t lo = z.shard.begin;
        t = buf.view(z.owned).slice(piece->begin - lo, piece->end - lo);
        info.offset = piece->param_offset;
      }
      out.push_back({opt_.name + "/" + name + "/" + what, t, info});
    };
    entry("master", z.master);
    for (size_t k = 0; k < z.states.size(); ++k) entry(names[k], z.states[k]);
  }
  out.push_back({opt_.name + "/step", Tensor(&steps_, DType::kInt64, Shape{1}), {}});
  return out;
}

void ShardedOptimizerImpl::gather_whole(const Bucket& z, const dp::FusionBuffer& mine,
                                        dp::FusionBuffer& whole, const OpOptions& o) {
  const BucketLayout& l = z.layout;
  const int64_t s = z.shard.shard_numel;
  std::vector<int64_t> counts(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r)
    counts[static_cast<size_t>(r)] =
        std::min<int64_t>((r + 1) * s, l.numel) - std::min<int64_t>(r * s, l.numel);
  if (!whole.data()) whole.allocate(l.device, mine.view().dtype(), l.numel, pool_);
  reducer_.group()->allgatherv(mine.view(z.owned), whole.view(), counts, o);
}

void ShardedOptimizerImpl::sync_default_stream() const {
#if TUTTI_WITH_CUDA
  if (!buckets_.empty() && buckets_.front().layout.device.is_cuda()) {
    cuda::DeviceGuard g(buckets_.front().layout.device.index);
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
#endif
}

// Every bucket's master weights and states gathered whole, then viewed per
// parameter.
StateDict ShardedOptimizerImpl::consolidate() {
  wait_parameters();
  StateDict out;
  const std::vector<std::string> names = zero::state_names(hyper_.kind);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& z = buckets_[i];
    const BucketLayout& l = z.layout;
    cuda::OptionalDeviceGuard device(l.device);
    z.full_states.resize(z.states.size());
    OpOptions o;
    o.name = opt_.name + " consolidate bucket " + std::to_string(i);
    gather_whole(z, z.master, z.full_master, o);
    for (size_t k = 0; k < z.states.size(); ++k) gather_whole(z, z.states[k], z.full_states[k], o);
    for (const BucketSlot& slot : l.slots) {
      out.push_back({slot.name, z.full_master.slice(slot.offset, slot.shape), {}});
      for (size_t k = 0; k < z.states.size(); ++k)
        out.push_back({slot.name + "/" + names[k], z.full_states[k].slice(slot.offset, slot.shape),
                       {}});
    }
  }
  sync_default_stream();
  out.push_back({opt_.name + "/step", Tensor(&steps_, DType::kInt64, Shape{1}), {}});
  return out;
}

}  // namespace tutti
