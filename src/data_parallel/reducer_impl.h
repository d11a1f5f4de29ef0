// The reducer's state.  reducer.cc holds registration, planning and the
// collective helpers (build, broadcasts); reducer_step.cc the per-step path
// (grad_ready, launch, synchronize, write-back).
//
// Step protocol (per rank; every rank follows the same sequence):
//  * a reducing pass copies each ready gradient into its bucket; a bucket
//    whose slots are all filled is launched once every bucket before it ON
//    ITS CHAIN was launched.  A chain is a list of buckets in plan order
//    whose collectives share one communicator: collectives on one
//    communicator must be issued in the same order on every rank, so each
//    chain's launch order is its bucket order on every rank whatever order
//    gradients arrive in.  Flat mode, host buckets, > 1 rank: bucket b is on
//    chain b mod N, each chain a private communicator split from the group
//    (channels_, N = ReducerOptions::launch_channels), so a complete bucket waits
//    only for the buckets N, 2N, ... before it.  Chains never wait on each
//    other (separate communicators, separate progress threads), and a rank
//    blocks only in synchronize(), after launching every bucket of every
//    chain, so no rank waits for a collective a peer will not issue.  Other
//    modes (one worker thread runs the buckets in order), CUDA buckets
//    (NCCL communicators used concurrently must see the same order) and
//    N = 1: one chain, the group, launch order == bucket order;
//  * synchronize() fills the slots never marked ready (accumulated grad if
//    used earlier in the step, else zeros), launches every bucket not
//    launched yet (chain by chain), then waits for and writes back bucket
//    0, 1, ... (write-back of bucket k overlaps the communication of
//    buckets > k);
//  * accumulation passes touch only the seen/used flags;
//  * learned order: grad_ready() appends each parameter to observed_order_
//    the first time it is seen; the first reducing synchronize() takes rank
//    0's order (a broadcast on the group's host communicator, inside a
//    collective call, so every rank is there) and re-plans the buckets in it
//    once (rebuild_buckets(); the gradient content is carried over);
//  * unused parameters: mark_unused() and, with static_graph, the start of
//    each reducing pass after the first fill a slot early (fill_slot(), the
//    same values synchronize() would use), so its bucket can launch;
//  * gradient_as_bucket_view: Param::grad IS the bucket slice; copies into
//    the bucket and the write-back are skipped, the average is formed in
//    place (the write-back's chunk table points into the bucket itself);
//  * pooled buffers (a bucket collective with pooled_buffers > 0,
//    reducer_pool.cc): Bucket::buffer borrows a PoolSlot from the first
//    write of a reducing pass (copy_into_bucket, fill_slot) until its
//    collective was waited for (synchronize, or acquire_buffer recycling
//    the oldest launched bucket); reset_step() returns whatever is held.
//    Waits only ever target a launched bucket, and a rank blocked on bucket
//    k has launched every bucket before k (one chain), so the lowest bucket
//    any rank waits for is launched by every rank (a rank not blocked goes on
//    to synchronize(), which launches everything): no deadlock.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "data_parallel/bucket_plan.h"
#include "data_parallel/bucket_worker.h"
#include "data_parallel/fusion_buffer.h"
#include "data_parallel/hierarchical.h"
#include "data_parallel/unflatten.h"
#include "tutti/data_parallel.h"

namespace tutti {
namespace dp {

enum class Mode {
  kFlat,          // one async sum all-reduce per bucket on the group
  kHierarchical,  // node / cross-node collectives on the worker thread
  kCompressed,    // the Compressor on the worker thread
};

struct Param {
  std::string name;
  Tensor param;
  Tensor grad;
  int bucket = -1;
  int64_t offset = 0;  // element offset in the bucket
  bool seen = false;   // marked ready in this pass (outside no_sync)
  bool used = false;   // marked ready since the last reducing pass
  bool marked_unused = false;  // filled by mark_unused/static graph this pass
  bool observed = false;       // seen before the order was learned
  bool grad_absent = false;    // view mode, registered without a gradient
  DType grad_dtype = DType::kFloat32;  // the bucket's dtype
};

struct Bucket {
  PlannedBucket plan;
  std::string op_name;  // "dp bucket 3"
  // plan.layout.numel, padded for the hierarchical scheme.  Shared: with
  // gradient_as_bucket_view, exported gradient views keep it alive.
  std::shared_ptr<FusionBuffer> buffer = std::make_shared<FusionBuffer>();
  FusionBuffer shard;   // hierarchical scratch (equal nodes only)
  std::vector<kernels::UnflattenChunk> chunks;
#if TUTTI_WITH_CUDA
  cuda::DeviceBuffer device_chunks;     // the chunk table, for the kernel
  std::unique_ptr<cuda::Event> joined;  // joins a second producer stream
  // Hierarchical mode: the three collectives run ordered on `side`, which
  // waits for `launched` (recorded on `stream` at launch) and records
  // `reduced`, which the write-back waits for.  So each stage's Work::wait()
  // holds up the side stream, never the producer's (compute) stream.
  std::unique_ptr<cuda::Stream> side;
  std::unique_ptr<cuda::Event> launched;
  std::unique_ptr<cuda::Event> reduced;
#endif
  int pool_slot = -1;       // pooled: the PoolSlot `buffer` borrows, or -1
  int pending = 0;          // slots not yet filled in this pass
  int chain = 0;            // launch chain (see the protocol above)
  bool issued = false;      // launched in this pass
  void* stream = nullptr;   // CUDA: stream the bucket is ordered on
  bool stream_set = false;
  int64_t launch_step = 0;  // step number handed to the compressor
  float launch_grad_scale = 1.0f;  // gradient scale handed to the compressor
  WorkPtr work;             // kFlat: the all-reduce in flight
  WorkPtr cross_work;       // kHierarchical: cross-node all-reduce in flight
};

}  // namespace dp

class ReducerImpl {
 public:
  ReducerImpl(ProcessGroupPtr group, ReducerOptions options);
  ~ReducerImpl();

  int add_parameter(const std::string& name, const Tensor& param,
                    const Tensor& grad);
  void build();
  void grad_ready(int index, void* stream);
  void mark_unused(int index, void* stream);
  Tensor gradient(int index) const;
  std::shared_ptr<const void> gradient_storage(int index) const;
  bool synchronize(void* stream);
  void enter_no_sync();
  void exit_no_sync();
  void broadcast_parameters(int root, void* stream);
  void broadcast_state(const StateDict& state, int root, void* stream);
  bool next_pass_reduces() const;
  // The bucket order will not change any more (learn_bucket_order off, or
  // the first reducing step has ended); the listener Reducer::synchronize()
  // calls when it becomes so.
  bool order_fixed() const;
  void set_plan_listener(std::function<void(bool)> fn);
  std::function<void(bool)> plan_listener() const;
  int num_parameters() const;
  ReducerStats stats() const;
  // The reducing-step counter (Reducer::state_dict views it).
  int64_t* step_counter() { return &step_; }
  void set_bucket_collective(BucketCollective fn, int pooled_buffers);
  int parameter_index(const std::string& name) const;
  Tensor parameter(int index) const;
  void set_grad_scale(float scale) {
    std::lock_guard<std::mutex> lock(mu_);
    grad_scale_ = scale;
  }

  ProcessGroupPtr group_;
  ReducerOptions opt_;
  std::vector<BucketLayout> layouts_;

 private:
  // reducer_step.cc
  void mark_filled(dp::Bucket& b, bool early);
  // Launches the complete buckets at the head of `chain`.
  void launch_ready(int chain, bool early);
  void launch(int bucket, bool early);
  void run_on_worker(int bucket);
  void* hier_stream(dp::Bucket& b);
  void hier_begin(dp::Bucket& b);
  void hier_finish(dp::Bucket& b);
  void fill_missing(dp::Bucket& b, void* stream);
  void fill_slot(dp::Param& p, dp::Bucket& b);
  void fill_early(dp::Param& p, void* stream);
  void begin_reducing_pass(void* stream);
  bool is_view(const dp::Param& p, const dp::Bucket& b) const;
  void copy_into_bucket(dp::Param& p, dp::Bucket& b, void* stream);
  // learned order (reducer.cc)
  void learn_order();
  // The replica check (ReducerOptions::check_parameters), once.
  void check_replicas(void* stream);
  void rebuild_buckets(const std::vector<int>& order);
  void set_stream(dp::Bucket& b, void* stream);
  void wait_bucket(int bucket);
  void write_back(dp::Bucket& b, void* stream);
  void abandon_step() noexcept;
  void reset_step();
  int64_t divisor() const;
  double post_divisor() const;
  bool averaged_by_allreduce(const dp::Bucket& b) const;
  void divide_bucket(dp::Bucket& b, double by, void* stream);
  // pooled bucket buffers (reducer_pool.cc)
  bool pooled() const { return !pool_slots_.empty(); }
  void install_pool(int buffers);
  void remove_pool();
  int add_pool_slot();
  void acquire_buffer(dp::Bucket& b, void* stream);
  void release_buffer(dp::Bucket& b);
  int64_t bucket_bytes() const;
  // reducer.cc
  void check_plan_agrees();
  void allocate_bucket(dp::Bucket& b);
  void install_plan(std::vector<dp::PlannedBucket> plan);
  void open_channels(const std::vector<dp::PlannedBucket>& plan);
  void plan_chains();
  std::vector<dp::ParamSpec> param_specs() const;
  void release_buckets();
  bool step_in_flight() const { return filled_in_pass_ > 0; }
  void require_built(const char* what) const;
  const char* mode_name() const;

  mutable std::mutex mu_;
  std::vector<dp::Param> params_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<dp::Bucket> buckets_;
  dp::Mode mode_ = dp::Mode::kFlat;
  bool built_ = false;
  bool order_learned_ = false;      // the first reducing step has ended
  bool replicas_checked_ = false;   // check_replicas() ran (or is off)
  bool pass_begun_ = false;         // begin_reducing_pass() ran this pass
  std::vector<int> observed_order_;  // first-seen order until learned
  std::vector<int> static_unused_;   // static_graph: unused in the first step
  // Launch chains: the buckets of each chain in plan order, and how many
  // of them were launched this pass.  channels_[c] carries chain c when not
  // empty (else the one chain uses group_).
  std::vector<CommunicatorPtr> channels_;
  std::vector<std::vector<int>> chains_;
  std::vector<size_t> chain_next_;
  int filled_in_pass_ = 0;   // slots filled in this reducing pass
  int seen_in_pass_ = 0;     // grad_ready calls in this pass (outside no_sync)
  int pass_in_step_ = 0;     // completed accumulation passes of this step
  int no_sync_depth_ = 0;
  int64_t step_ = 0;
  float grad_scale_ = 1.0f;  // Reducer::set_gradient_scale
  BucketCollective collective_;  // replaces the all-reduce (ZeRO-2)
  std::function<void(bool)> plan_listener_;  // Reducer::set_plan_listener
  // Pooled bucket buffers (empty: every bucket owns its buffer).
  std::vector<std::unique_ptr<dp::PoolSlot>> pool_slots_;
  std::vector<int> free_slots_;
  int64_t pool_slot_bytes_ = 0;
  ReducerStats stats_;
  HostBufferPool pool_;
  std::unique_ptr<dp::HierarchicalAllreduce> hier_;
  std::unique_ptr<dp::BucketWorker> worker_;  // declared last: stops first
};

}  // namespace tutti
