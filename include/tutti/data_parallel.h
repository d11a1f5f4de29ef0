// Data parallelism: the gradient reducer.
//
//   tutti::Reducer reducer(tutti::world());
//   for (auto& p : model.parameters())            // registration order
//     reducer.add_parameter(p.name, p.value, p.grad);
//   reducer.build();                              // plan + cross-rank check
//   reducer.broadcast_parameters(0);              // same start everywhere
//   for (;;) {
//     backward(..., [&](int i) { reducer.grad_ready(i); });  // last layer first
//     if (reducer.synchronize()) optimizer.step();            // grads averaged
//     zero_grads();
//   }
//
// The reducer packs gradients into fusion buckets (reverse registration
// order, capped by bytes, one dtype and device each) and all-reduces a bucket
// as soon as it is complete, while the backward pass is still running.
// synchronize() waits for the buckets and writes the result back into every
// registered gradient tensor in one fused pass (unflatten + divide).
//
// Contracts:
//  * Every rank registers the same parameters (names, shapes, dtypes) in the
//    same order with the same options; build() checks this and fails on
//    EVERY rank with the first differing entry (Error kMismatch), no hang.
//  * A "backward pass" is the grad_ready() calls between two synchronize()
//    calls.  grad_ready(i) is called at most once per pass per parameter,
//    when gradient i is final; parameters may become ready in any order and
//    in different orders on different ranks (buckets are launched in bucket
//    order on every rank, so collectives always match).
//  * Bucket order: after the first reducing step the buckets are re-planned
//    in the observed ready order (learn_bucket_order); buckets() and, with
//    gradient_as_bucket_view, gradient(i) change then, once
//    (set_plan_listener() tells whoever follows the plan).
//  * Unused parameters: a gradient not marked ready in a reducing pass
//    contributes its current content if it was marked ready in an earlier
//    pass of the same step (accumulation), else ZERO.  synchronize() fills
//    and launches the missing buckets in order; no error, no deadlock.  The
//    result is written to every registered gradient, used or not, and is the
//    same on every rank.  mark_unused() (find_unused_parameters) or
//    static_graph fill such slots early, so their buckets need not wait.
//  * Accumulation: gradients accumulate in the caller's tensors (as in
//    PyTorch, backward adds into .grad).  Passes inside a no_sync() scope,
//    and the first backward_passes_per_step - 1 passes of a step, do not
//    communicate at all.  The reducer divides by the number of ranks, not
//    by the number of passes (scale the loss by 1/passes for a mean).
//  * Bit-identity: after a reducing synchronize() every rank holds the same
//    bits in every gradient (each element is reduced by the backend once, or
//    by commutative pairwise sums, then divided the same way everywhere), so
//    a non-finite check after synchronize() (AMP loss scaling) agrees across
//    the data-parallel group without another collective.
//  * Replicas: the first reducing synchronize() checks that every rank's
//    parameters hold the same bytes (check_parameters) and fails on every
//    rank naming the first differing parameter.
//  * Memory: fusion buffers are allocated by build() and reused; steps do
//    not allocate buffers (stats().buffer_allocations stays constant after
//    the first reducing step, which may re-plan the buckets once).
//  * CUDA gradients: copies, the all-reduce (NCCL, on the communicator's
//    stream, ordered after the caller's stream by events) and the write-back
//    kernel are stream-ordered; the host never waits for the GPU.  The
//    gradients are final on the stream passed to synchronize().
//  * Threads: the methods may be called from several threads (a mutex
//    guards the state).  While a reducing pass is in flight (first
//    grad_ready() to synchronize()) issue no other collectives on the
//    reducer's group: which buckets are launched at a given point may differ
//    across ranks.  Use a split group for logging all-reduces.  A
//    NoSyncGuard must not outlive its reducer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/compression.h"
#include "tutti/export.h"
#include "tutti/process_group.h"
#include "tutti/state.h"
#include "tutti/tensor.h"

namespace tutti {

struct ReducerOptions {
  // Bucket cap in MiB (TUTTI_BUCKET_MB; default 25).  A bucket is closed
  // before a tensor would take it over the cap; a tensor larger than the cap
  // gets a bucket of its own.  Must be > 0.
  double bucket_cap_mb = 25;
  // Cap of the first bucket of each dtype (the last layers' gradients), so
  // communication starts early in the backward pass
  // (TUTTI_FIRST_BUCKET_MB; default 1).  0: use bucket_cap_mb.
  double first_bucket_cap_mb = 1;
  // Backward passes per optimiser step: passes 1..N-1 only accumulate
  // (no communication); the N-th pass's synchronize() reduces.  >= 1.
  int backward_passes_per_step = 1;
  // Hierarchical all-reduce (TUTTI_HIERARCHICAL; default off): sum within
  // the node (reduce-scatter), across nodes (all-reduce of each shard), then
  // share within the node (all-gather).  Nodes of unequal size use node
  // all-reduce, all-reduce among node leaders, node broadcast instead.
  // Ignored (with a warning) when a compressor is set.
  bool hierarchical = false;
  // Ranks per "node" for the hierarchical all-reduce: 0 (default) finds
  // nodes with MPI's shared-memory split; N > 0 treats consecutive groups of
  // N group ranks as nodes (topologies MPI cannot see, and tests).
  int hierarchical_node_size = 0;
  // Replaces each bucket's all-reduce (see tutti/compression.h); null: a
  // plain sum all-reduce divided by the group size.  Requires op == kAvg.
  // The compressor runs on the reducer's communication thread; its
  // CompressContext::step counts reducing passes from 0 (a pass that failed
  // consumes its number, so steps only increase).
  std::shared_ptr<Compressor> compressor;
  // kAvg (default): gradients are averaged over the group's ranks; kSum:
  // summed.  Other ops are rejected.
  ReduceOp op = ReduceOp::kAvg;
  // Horovod's gradient_predivide_factor f: with op kAvg, each rank's bucket
  // is divided by f before the sum and the sum by W / f after it (W: group
  // size), so the result is still the average.  1 (default): sum, then
  // divide by W (most accurate unless the sum overflows, see
  // docs/data_parallel.md); W: divide everything before the sum.  Finite and
  // > 0; a value other than 1 needs op kAvg, float32, float16 or bfloat16
  // gradients, and no compressor or one that takes it (none, fp16, bf16:
  // Compressor::takes_predivide(); kInvalidArgument otherwise).  When W / f
  // is an integer the division after the sum is fused into the write-back;
  // else the bucket is divided by float(W / f) first (one more rounding).
  // With a compressor, 1 leaves the split to it (fp16/bf16 divide by W
  // before the cast); another f is handed to it (CompressContext::
  // predivide_factor): divided by f before the cast, by W / f after it.
  double gradient_predivide_factor = 1.0;
  // Names the reducer in errors and operation names ("dp bucket 3").
  std::string name = "dp";
  // Learned bucket order (TUTTI_LEARN_BUCKET_ORDER; default on): the first
  // reducing synchronize() records the order in which this rank's gradients
  // became ready, takes rank 0's order (one broadcast), and re-plans the
  // buckets in it (parameters never ready go last), so that later steps
  // fill bucket 0 first and every bucket launches as soon as it is complete
  // (buckets launch in bucket order on every rank: a bucket never overtakes
  // an earlier one, which is why the order matters).  Must agree across
  // ranks.  Ignored with a compressor (its per-bucket state would be lost).
  bool learn_bucket_order = true;
  // The caller reports the parameters a pass will not produce with
  // mark_unused() (tutti.torch's DDP searches the autograd graph each
  // forward); their slots are filled at once, so their buckets need not wait
  // for synchronize().  Without it mark_unused() is refused.
  bool find_unused_parameters = false;
  // Every reducing pass uses the same parameters: those not ready in the
  // first reducing pass are marked unused at the start of every later
  // reducing pass (no search).  A pass that then produces one of them fails
  // with kInvalidArgument on that rank.  May differ across ranks.
  bool static_graph = false;
  // Gradients live in the buckets (PyTorch DDP's gradient_as_bucket_view):
  // after build(), gradient(i) is parameter i's slice of its bucket and the
  // only gradient memory the reducer reads or writes: no copy into the
  // bucket, no copy back (the average is formed in place).  add_parameter()
  // may then pass an undefined gradient; a defined one only seeds the
  // slice's content at build().  gradient(i) moves once if the learned order
  // rebuilds the buckets (stats().bucket_rebuilds; content carried over).
  bool gradient_as_bucket_view = false;
  // Launch chains (TUTTI_DP_LAUNCH_CHANNELS; default 4): host buckets of
  // the flat all-reduce (more than one rank) are spread over this many
  // private communicators, bucket b on chain b mod N, and a complete bucket
  // launches once the buckets before it on its chain have (docs/
  // data_parallel.md, "Launch chains").  1: launch in bucket order.  1..64;
  // must agree across ranks.
  int launch_channels = 4;
  // Replica check (TUTTI_CHECK_PARAMETERS; default on): the first reducing
  // synchronize(), once its reduction is complete (before the optimiser's
  // first step), digests every registered parameter's bytes and compares
  // the digests across the group (one 8-byte allgather on the group's host
  // communicator; CUDA parameters are copied to the host once for it).
  // Replicas that differ (a forgotten broadcast_parameters()) fail with
  // kMismatch on every rank naming the first differing parameter and the
  // ranks.  Over this reducer's group only (the data-parallel replicas).
  // Off where replicas legitimately differ.  Must agree across ranks.
  bool check_parameters = true;

  // The defaults above with the TUTTI_* settings applied: TUTTI_BUCKET_MB,
  // TUTTI_FIRST_BUCKET_MB, TUTTI_HIERARCHICAL, TUTTI_LEARN_BUCKET_ORDER,
  // TUTTI_DP_LAUNCH_CHANNELS, TUTTI_CHECK_PARAMETERS, and
  // TUTTI_COMPRESSION (a compressor from
  // make_compressor() unless it is "none").  Options built otherwise do not
  // read the environment.
  TUTTI_API static ReducerOptions from_env();
};

struct ReducerStats {
  int64_t steps = 0;                // synchronize() calls that reduced
  int64_t accumulation_passes = 0;  // synchronize() calls that did not
  int64_t buckets_reduced = 0;      // bucket all-reduces launched
  int64_t buckets_launched_early = 0;  // ... of which from grad_ready()
  int64_t bytes_reduced = 0;        // gradient bytes all-reduced (per rank)
  int64_t unready_gradients = 0;    // gradients synchronize() filled in
  double wait_seconds = 0;          // synchronize() blocked on communication
  double writeback_seconds = 0;     // the fused write-back (host time)
  int64_t buffer_allocations = 0;   // fusion/staging buffers ever allocated
  int64_t bucket_rebuilds = 0;      // re-plans in the learned order (0 or 1)
  int64_t bytes_copied_in = 0;      // gradient bytes copied into buckets
  int64_t bytes_copied_out = 0;     // bucket bytes written back to gradients
  int64_t marked_unused = 0;        // slots filled early (mark_unused, static)
  // Bytes of full-size bucket buffers allocated now: every bucket's, or
  // with pooled buffers (set_bucket_collective) the pool's.  Padding to a
  // multiple of the group size included; the hierarchical scratch not.
  int64_t bucket_bytes = 0;
  // Pooled buffers: a bucket needed a buffer while none was free and
  // waited for the oldest launched bucket's collective to recycle one
  // (pool_waits), or none was launched yet and the pool grew by one
  // (pool_growths; the pool keeps that buffer).
  int64_t pool_waits = 0;
  int64_t pool_growths = 0;
};

class Reducer;
class ReducerImpl;

// A collective that replaces a bucket's sum all-reduce (Reducer::
// set_bucket_collective): `flat` is bucket `bucket`'s buffer padded with
// zeros to a multiple of the group size; `options` names the bucket and, for
// CUDA buckets, carries the stream the bucket is ready on.  Returns the Work
// synchronize() waits for.
using BucketCollective =
    std::function<WorkPtr(int bucket, const Tensor& flat, const OpOptions& options)>;

// While alive, backward passes accumulate locally: grad_ready() only records
// which gradients were produced and synchronize() returns false without
// communicating.  Nestable.  Open it between passes (not after some
// gradients of a reducing pass were marked ready).
class TUTTI_API NoSyncGuard {
 public:
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  friend class Reducer;
  explicit NoSyncGuard(ReducerImpl* impl) : impl_(impl) {}
  ReducerImpl* impl_;
};

class TUTTI_API Reducer : public Stateful {
 public:
  // `group` is the data-parallel group.  Options are validated here
  // (kInvalidArgument).  Nothing collective happens before build().
  explicit Reducer(ProcessGroupPtr group,
                   ReducerOptions options = ReducerOptions::from_env());
  // Waits for communication still in flight (errors are logged, not thrown).
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Registers a parameter and its gradient tensor (same numel and device;
  // the gradient's dtype decides the bucket).  Both views must stay valid
  // for the reducer's lifetime.  Names must be unique.  Returns the index
  // grad_ready() takes (0, 1, 2, ... in registration order).  Before build().
  int add_parameter(const std::string& name, const Tensor& param,
                    const Tensor& grad);

  // Collective.  Plans the buckets, checks across ranks that parameters and
  // options agree (kMismatch on every rank naming the first difference),
  // allocates the fusion buffers, sets up the compressor and, for the
  // hierarchical all-reduce, splits the group.  Once.
  void build();

  // Gradient `index` is final for this pass.  In a reducing pass it is
  // copied into its bucket (CUDA: on `stream`, a cudaStream_t) and a bucket
  // whose gradients are all in is all-reduced asynchronously once the
  // buckets before it were launched.  In an accumulation pass it is only
  // recorded.  Never blocks on communication.
  void grad_ready(int index, void* stream = nullptr);

  // Gradient `index` will not be produced in this pass (find_unused_
  // parameters): in a reducing pass its slot is filled at once (its
  // accumulated value if an earlier pass of the step produced it, else
  // zero), so its bucket can launch during the backward pass.  A later
  // grad_ready(index) in the same pass is kInvalidArgument.
  void mark_unused(int index, void* stream = nullptr);

  // The gradient tensor the reducer reads and writes for parameter `index`:
  // the registered one, or with gradient_as_bucket_view its slice of the
  // bucket (after build()).  gradient_storage() keeps that memory alive
  // (for exporters such as the Python bindings) even past a bucket rebuild
  // or the reducer's end.
  Tensor gradient(int index) const;
  std::shared_ptr<const void> gradient_storage(int index) const;

  // Ends a backward pass.  Returns true when this pass reduced: every
  // registered gradient then holds the group average (or sum), bit-identical
  // on every rank (CUDA: on `stream`).  Returns false for an accumulation
  // pass (inside no_sync(), or before the backward_passes_per_step-th pass)
  // without communicating.  Collective for reducing passes.  A failed
  // communication rethrows here; the reducer is then ready for a new step.
  bool synchronize(void* stream = nullptr);

  // Accumulate without communicating while the guard lives.
  NoSyncGuard no_sync();

  // The factor the gradients of the following passes carry: the AMP loss
  // scale when the reducer averages scaled gradients (unscaling after
  // synchronize()).  Handed to the compressor (CompressContext::grad_scale)
  // so error-feedback residuals follow loss-scale changes.  Finite and
  // positive; default 1.  Call between passes, e.g. after each
  // amp::DynamicLossScaler::update().
  void set_gradient_scale(float scale);

  // Collective: copies every registered parameter from `root` to the other
  // ranks (host tensors packed into chunks of bucket_cap_mb; CUDA tensors
  // one broadcast each, ordered on `stream`).  After build(), between steps.
  void broadcast_parameters(int root = 0, void* stream = nullptr);

  // Collective: copies `state` (optimiser state, step counters) from `root`.
  // Per-rank entries (ShardInfo::per_rank, e.g. a compressor's
  // error-feedback residuals) are left as each rank has them.
  // The lists must agree across ranks (names, dtypes, shapes): a difference
  // is kMismatch on every rank naming the first differing entry.  The
  // Stateful form broadcasts state_dict() and then calls on_state_loaded()
  // on every rank but the root.
  void broadcast_state(const StateDict& state, int root = 0,
                       void* stream = nullptr);
  void broadcast_state(Stateful& component, int root = 0,
                       void* stream = nullptr);

  // Replaces every bucket's sum all-reduce with `fn` (the sharded
  // optimizer's reduce-scatter, tutti/zero.h); null restores the all-reduce.
  // synchronize() then waits for fn's Work and leaves the bucket and the
  // registered gradients as they are (no division, no write-back): fn's
  // owner consumes the result.  Only in the plain mode (no compressor, not
  // hierarchical, gradient_predivide_factor 1, op kAvg): kInvalidArgument
  // otherwise.  After build(), between steps; fn runs on the thread that
  // launches the bucket (grad_ready or synchronize), under the reducer's
  // lock, so it must not call back into the reducer.
  //
  // pooled_buffers > 0 (copying reducers only: gradient_as_bucket_view =
  // false, and the bucket order fixed or already learned): the buckets'
  // full-size buffers are freed and replaced by a pool of that many buffers
  // of the largest bucket's size, unless that pool would take as much
  // memory as the buckets' own buffers (then they are kept).  A bucket takes one when its first slot
  // is filled in a reducing pass and gives it back once fn's Work has
  // completed (synchronize(), or earlier: a bucket that finds the pool
  // empty waits, inside grad_ready(), for the oldest launched bucket's
  // collective; if no bucket holding a buffer is launched yet the pool
  // grows by one, stats().pool_growths).  So `flat` passed to fn is valid
  // until fn's Work completes, no longer.  When gradients become ready in
  // bucket order (reverse registration order, the usual backward pass), 2
  // buffers keep one bucket filling while the previous one is reduced.
  // Null fn frees the pool and gives every bucket its own buffer again.
  void set_bucket_collective(BucketCollective fn, int pooled_buffers = 0);

  // The index of the parameter registered as `name`, and parameter `index`
  // as registered (kInvalidArgument if there is none).
  int parameter_index(const std::string& name) const;
  Tensor parameter(int index) const;

  // The bucket plan (after build()): bucket i is all-reduced i-th.
  const std::vector<BucketLayout>& buckets() const;
  // True once buckets() will not change any more: learn_bucket_order is
  // off, or the first reducing synchronize() has learned the order.
  bool bucket_order_fixed() const;
  // `fn(replanned)` runs on every rank at the end of the reducing
  // synchronize() that fixes the bucket order (the first one, with
  // learn_bucket_order), after the gradients were written back and outside
  // the reducer's lock (fn may call the reducer and issue collectives on its
  // group: every rank is there); `replanned` says whether buckets() changed
  // (stats().bucket_rebuilds went up).  An exception from fn propagates out
  // of synchronize(), whose reduction has completed.  Not called when the
  // order is already fixed.  One listener (the sharded optimizer, which
  // moves its shards to the new plan); null removes it.
  void set_plan_listener(std::function<void(bool replanned)> fn);
  int num_parameters() const;
  // True when the next synchronize() will communicate.
  bool next_pass_reduces() const;
  const ReducerOptions& options() const;
  const ProcessGroupPtr& group() const;
  ReducerStats stats() const;

  // Stateful: "<name>/step" (int64 [1]), the reducing-step counter handed to
  // the compressor (CompressContext::step; e.g. PowerSGD's start step), so
  // a resumed run continues the count instead of restarting it at 0.  Load
  // it between steps, after build().  (Compressor state travels separately:
  // options().compressor is Stateful too.)
  StateDict state_dict() override;

 private:
  std::unique_ptr<ReducerImpl> impl_;
};

}  // namespace tutti
