// ZeRO-1/2: an optimizer whose float32 master weights and state are split
// across the data-parallel ranks.
//
//   tutti::Reducer reducer(dp);
//   for (auto& p : model.parameters()) reducer.add_parameter(p.name, p.value, p.grad);
//   reducer.build();
//   reducer.broadcast_parameters(0);               // same start everywhere
//   tutti::optim::Hyper adam;  adam.kind = tutti::optim::Kind::kAdamW;  adam.lr = 3e-4f;
//   tutti::ShardedOptimizer opt(reducer, adam, {/*stage=*/2});
//   for (;;) {
//     backward(..., [&](int i) { reducer.grad_ready(i); });
//     if (reducer.synchronize()) opt.step();       // shard update + all-gather
//   }
//
// Layout: bucket b's flat range [0, N_b) is split into W (group size)
// contiguous shards of S_b = ceil(N_b / W) elements; rank r owns
// [r * S_b, min((r + 1) * S_b, N_b)) (the last shards are shorter or empty;
// a parameter may straddle a shard boundary).  Each rank keeps float32
// master weights and optimizer state for its shards only: 4 * (1 +
// num_states) bytes per owned element instead of per parameter.
//
// Stage 2 replaces each bucket's all-reduce by a reduce-scatter (averaged,
// Reducer::set_bucket_collective), so a rank receives only its shard's
// gradient; the registered gradients then keep this rank's local
// (unreduced) values.  With a copying reducer the buckets' full-size
// buffers come from a small pool (options.bucket_buffers) and exist only
// while a bucket is filled and reduce-scattered, so the gradient memory the
// reducer and optimizer hold is O(model / W + a few buckets)
// (gradient_bytes()).  In stage 2 a registered gradient is therefore never
// a bucket view across steps: with gradient_as_bucket_view the buckets stay
// whole (no gradient saving); use the copying reducer.  Stage 1 keeps the
// all-reduce (every gradient holds the average) and reads its shard.  Both
// then, bucket by bucket, run a fused optim::step over the bucket's shard,
// round the new master weights into a bucket-shaped buffer (model dtype;
// from a small pool, options.gather_buffers), all-gather it, and write the
// parameters.
//
// Contracts:
//  * Construct after reducer.build() and the parameter broadcast (the master
//    weights start as float(parameters)).  A reducer that learns its bucket
//    order (ReducerOptions::learn_bucket_order) re-plans the buckets inside
//    its first reducing synchronize(); the shards, the state (initial or
//    loaded) and stage 2's gradient shard move to the new plan there (one
//    all-gather per old bucket, Reducer::set_plan_listener), so shards() and
//    gradient_shards() follow it once that synchronize() has returned; stage
//    2 pools the reducer's bucket buffers from then on.  Construction is
//    collective: every rank must pass the same stage and hyper-parameters
//    (kMismatch on every rank naming the first differing field and rank).
//  * A parameter's dtype equals its gradient's: float32, float16 or
//    bfloat16.  All buckets on the host, or on CUDA (then step() is ordered
//    on `stream` like Reducer::synchronize; nothing waits on the host).
//  * step() is collective (one all-gather per bucket) and follows a reducing
//    synchronize(), once (a second step() on the same gradients is
//    kInvalidArgument); it is the only writer of the parameters.  Skipping
//    it (an AMP overflow) is fine.
//  * Bit-identity with the unsharded optimizer (Reducer all-reduce, then
//    optim::step over whole tensors): stage 1 always (same reduction, same
//    element-wise update); stage 2 when the reduce-scatter sums in the same
//    order as the all-reduce (docs/zero.md says when that holds).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/data_parallel.h"
#include "tutti/export.h"
#include "tutti/optim.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {

struct ShardedOptimizerOptions {
  // 1: all-reduce, keep the shard (ZeRO-1); 2: reduce-scatter (ZeRO-2).
  int stage = 2;
  // Stage 2 only: the dtype gradients travel in on the reduce-scatter
  // (compression): kFloat32 (default) means the bucket's own dtype;
  // kFloat16 or kBFloat16 cast float32 buckets down before the collective
  // and the shard back up after it (docs/zero.md, "Compression").
  DType reduce_dtype = DType::kFloat32;
  // step() returns once the all-gathers are launched; the parameters are
  // written by wait_parameter(i) (e.g. from a forward pre-hook, so the
  // all-gather overlaps the next forward pass) or wait_parameters().  The
  // next step(), consolidate() and a load wait for everything first.
  bool overlap_all_gather = false;
  // Stage 2 with a copying reducer (gradient_as_bucket_view = false): the
  // reducer keeps this many full-size bucket buffers in a pool instead of
  // one per bucket (Reducer::set_bucket_collective); a bucket holds one
  // from its first gradient until its reduce-scatter has finished, which
  // writes this rank's shard straight into the persistent gradient shard.
  // Gradient memory on this rank is then sum_b S_b + bucket_buffers *
  // max_b N_b elements instead of sum_b (S_b + N_b).  2 (default) lets one
  // bucket fill while the previous one is reduce-scattered; 1 serialises
  // them; 0 keeps every bucket's buffer (no saving), and so does a pool
  // that would not be smaller than the buckets (bucket_buffers * the
  // largest padded bucket >= all of them: few buckets, e.g. the default
  // 25 MiB cap on a small model; lower ReducerOptions::bucket_cap_mb).
  // Ignored in stage 1 and with bucket views (whose gradients live in the
  // buckets).  Local: may differ across ranks.  Must be >= 0.
  int bucket_buffers = 2;
  // The parameter all-gather's bucket-shaped buffers (W * S_b elements in
  // the model dtype): without overlap_all_gather, a pool of this many,
  // each taken by a bucket for its update and all-gather and given back
  // once its parameters are written (a bucket finding the pool empty first
  // finishes the oldest all-gather in flight); so they cost gather_buffers
  // buckets instead of one more model copy.  0, or overlap_all_gather
  // (every all-gather launched before the first wait): one per bucket; so
  // too when the pool would not be smaller (as for bucket_buffers).
  // Both stages.  Local: may differ across ranks.  Must be >= 0.
  int gather_buffers = 2;
  // Prefix of the state names and of error messages.
  std::string name = "zero";
};

// One shard of one bucket, as this rank owns it.
struct ZeroShard {
  int bucket = 0;
  int64_t bucket_numel = 0;  // N_b
  int64_t shard_numel = 0;   // S_b = ceil(N_b / W)
  int64_t begin = 0;         // this rank's range [begin, end) of the bucket
  int64_t end = 0;
};

class ShardedOptimizerImpl;

class TUTTI_API ShardedOptimizer : public Stateful {
 public:
  // Collective (agreement of options and hyper-parameters).  Keeps a
  // reference to `reducer`, which must outlive the optimizer; stage 2
  // installs its reduce-scatter into the reducer until destruction.
  ShardedOptimizer(Reducer& reducer, const optim::Hyper& hyper,
                   ShardedOptimizerOptions options = {});
  ~ShardedOptimizer() override;
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Collective.  Updates this rank's shards from their averaged gradients
  // times `grad_scale` (e.g. the loss scaler's inv_scale(), times a clip
  // coefficient), then all-gathers the parameters.  hyper().step is set to
  // steps() + 1 for the update.  CUDA: ordered on `stream`.
  void step(float grad_scale = 1.f, void* stream = nullptr);

  // overlap_all_gather: writes the parameters of reducer parameter
  // `index`'s bucket and of the buckets launched before it (the all-gathers
  // run last bucket first, i.e. first-registered layers first), or of all
  // buckets.  No-ops for buckets already written.  CUDA: on step()'s stream.
  void wait_parameter(int index);
  void wait_parameters();

  // The averaged gradient elements this rank owns (after a reducing
  // synchronize()): each gradient element belongs to exactly one rank, so a
  // non-finite check or a norm over these, combined over the group, counts
  // every element once (amp::DynamicLossScaler::check with groups = {dp};
  // amp::grad_norm with group = dp).  Views; valid until the next step().
  std::vector<Tensor> gradient_shards() const;

  // Learning rate and other fields for the following steps (must stay
  // equal on every rank; step is managed here).
  optim::Hyper& hyper();
  const optim::Hyper& hyper() const;
  int64_t steps() const;  // completed step() calls
  const ShardedOptimizerOptions& options() const;
  const std::vector<ZeroShard>& shards() const;
  // Bytes of float32 master weights + optimizer state on this rank.
  int64_t state_bytes() const;
  // The same for an unsharded optimizer over every parameter.
  int64_t unsharded_state_bytes() const;
  // Bytes of gradient storage the reducer and this optimizer hold on this
  // rank: the reducer's bucket buffers (ReducerStats::bucket_bytes: every
  // bucket's, or stage 2's pool of bucket_buffers) plus stage 2's gradient
  // shards and reduce_dtype wire buffers.  Not counted: the caller's
  // registered gradient tensors (copying reducer) - with bucket views
  // those are the buckets, counted once.
  int64_t gradient_bytes() const;
  // Bytes of the all-gather buffers on this rank (gather_buffers' pool, or
  // one per bucket): sum_b W * S_b elements unpooled, gather_buffers *
  // max_b W * S_b pooled.
  int64_t gather_bytes() const;

  // Stateful: "<name>/<param>/master" and "<name>/<param>/<state>" (state
  // names as in consolidate()): float32, ShardInfo::flat over the
  // parameter's elements, holding the piece this rank's shards cover (empty
  // where none; group "dp"), and "<name>/step" (int64 [1], replicated).
  // Per parameter, so a checkpoint loads at any other world size and under
  // any other bucket plan (saved after the learned re-plan, loaded before
  // it; other bucket caps).
  StateDict state_dict() override;
  // Collective: writes the loaded master weights into the parameters (the
  // all-gather of step()), so the model matches its master copy.
  void on_state_loaded() override;

  // Collective: the unsharded float32 master weights and optimizer state,
  // per parameter ("<param>" and "<param>/<state>", state names momentum_buf
  // or exp_avg, exp_avg_sq; "<name>/step"), replicated on every rank, for
  // export (CheckpointManager::save of the returned views writes a
  // safetensors-readable checkpoint).  The views stay valid until the next
  // consolidate() or the optimizer's end.
  StateDict consolidate();

 private:
  std::unique_ptr<ShardedOptimizerImpl> impl_;
};

}  // namespace tutti
