// ShardedOptimizer: following the reducer's learned bucket order.  The
// reducer re-plans its buckets once, inside its first reducing
// synchronize() (ReducerOptions::learn_bucket_order); the shards are cut
// from the bucket layout, so the state built for the registration-order plan
// (or loaded into it from a checkpoint) moves to the new plan there.
#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/zero/zero_impl.h"
#include "tutti/log.h"

namespace tutti {

using zero::Bucket;

namespace {

// One old bucket gathered whole: master, states and (stage 2) the averaged
// gradient, each over the bucket's N elements.
struct WholeBucket {
  dp::FusionBuffer master, grad;
  std::vector<dp::FusionBuffer> states;
};

}  // namespace

// Once per job, so simple beats lean: every old bucket's flat arrays are
// all-gathered whole (allgatherv of the uneven shards: transient memory of
// (2 + num_states) float32 copies of the model on every rank), the layout is
// rebuilt from the reducer's new plan, and each rank copies its new shard's
// pieces out of the whole arrays by parameter.
void ShardedOptimizerImpl::remap() {
  wait_parameters();  // no all-gather may still write the old buffers
  std::vector<Bucket> old;
  old.swap(buckets_);
  // Where each reducer parameter lay in the old plan.
  std::vector<std::pair<int, int64_t>> where(static_cast<size_t>(reducer_.num_parameters()),
                                             {-1, 0});
  std::vector<WholeBucket> whole(old.size());
  for (size_t i = 0; i < old.size(); ++i) {
    const Bucket& z = old[i];
    const BucketLayout& l = z.layout;
    cuda::OptionalDeviceGuard device(l.device);
    for (size_t s = 0; s < l.slots.size(); ++s)
      where[static_cast<size_t>(z.slot_params[s])] = {static_cast<int>(i), l.slots[s].offset};
    WholeBucket& w = whole[i];
    OpOptions o;
    o.name = opt_.name + " remap bucket " + std::to_string(i);
    gather_whole(z, z.master, w.master, o);
    w.states.resize(z.states.size());
    for (size_t k = 0; k < z.states.size(); ++k) gather_whole(z, z.states[k], w.states[k], o);
    // Stage 2: this step's averaged gradient, not consumed yet.
    if (opt_.stage == 2) gather_whole(z, z.grad, w.grad, o);
  }
  build_layout();
  for (Bucket& z : buckets_) {
    cuda::OptionalDeviceGuard device(z.layout.device);
    for (const zero::Piece& p : z.pieces) {
      const auto& at = where[static_cast<size_t>(p.param)];
      TUTTI_CHECK(at.first >= 0, "ShardedOptimizer '", opt_.name, "': parameter '", p.name,
                  "' is in no bucket of the previous plan");
      const WholeBucket& w = whole[static_cast<size_t>(at.first)];
      const int64_t src = at.second + p.param_offset, n = p.end - p.begin;
      const int64_t dst = p.begin - z.shard.begin;
      z.master.copy_in(dst, w.master.view().slice(src, src + n), nullptr);
      for (size_t k = 0; k < z.states.size(); ++k)
        z.states[k].copy_in(dst, w.states[k].view().slice(src, src + n), nullptr);
      if (opt_.stage == 2) z.grad.copy_in(dst, w.grad.view().slice(src, src + n), nullptr);
    }
  }
  sync_default_stream();  // before `whole` is freed
  TUTTI_LOG(kInfo) << "ShardedOptimizer '" << opt_.name << "': moved the shards onto the "
                   << buckets_.size() << " buckets of the learned order (from " << old.size()
                   << ")";
}

}  // namespace tutti
