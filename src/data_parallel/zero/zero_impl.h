// The sharded optimizer's state (tutti/zero.h).  sharded_optimizer.cc holds
// setup and the step; zero_gather.cc the update and all-gather;
// zero_state.cc the checkpoint state and consolidate(); zero_remap.cc the
// move onto the reducer's learned bucket plan (point-to-point, O(model / W)
// bytes per rank).
//
// Per bucket b (N elements, W ranks, S = ceil(N / W), this rank r):
//  * master, states[k]: float32, the n = |[r*S, min((r+1)*S, N))| elements
//    this rank owns;
//  * grad (stage 2): S elements, the reduce-scatter's output (the averaged
//    gradient of this rank's block; elements >= n are padding);
//  * wire (stage 2 with reduce_dtype): the bucket cast down, W * S elements;
//  * gather: W * S elements in the parameters' dtype; step() writes the
//    rounded master weights into block r, all-gathers in place, and copies
//    [0, N) into the parameters (the reducer's unflatten, divisor 1).
//    Owned per bucket with overlap_all_gather (or gather_buffers = 0), else
//    borrowed from a pool of gather_buffers slots (zero_gather.cc) from the
//    bucket's update until its parameters are written.  step() therefore
//    updates and launches bucket by bucket (last first), one optim::step
//    per bucket over its step lists.
// Pieces: the parts of parameters inside [r*S, r*S + n); stage 1 reads its
// gradients through them (Reducer::gradient), stage 2 from `grad`.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/host_buffer.h"
#include "data_parallel/fusion_buffer.h"
#include "data_parallel/unflatten.h"
#include "tutti/zero.h"

namespace tutti {

namespace zero {

struct Piece {
  int param = -1;          // the reducer's parameter index
  std::string name;        // the parameter's name
  int64_t begin = 0;       // bucket range [begin, end) inside this shard
  int64_t end = 0;
  int64_t param_offset = 0;  // where `begin` lies in the flattened parameter
};

struct Bucket {
  BucketLayout layout;
  ZeroShard shard;
  int64_t owned = 0;       // n = shard.end - shard.begin
  dp::FusionBuffer master;
  std::vector<dp::FusionBuffer> states;
  dp::FusionBuffer grad;
  dp::FusionBuffer wire;
  DType wire_dtype = DType::kFloat32;
  dp::FusionBuffer gather;
  int gather_slot = -1;          // pooled: the slot `gather` borrows
  std::vector<Piece> pieces;
  std::vector<kernels::UnflattenChunk> chunks;  // gather -> parameters
#if TUTTI_WITH_CUDA
  cuda::DeviceBuffer device_chunks;
#endif
  std::vector<int> slot_params;  // slot s -> reducer parameter index
  // The bucket's optim::step lists (views, built once; copies re-pointed at
  // the gather buffer when pooled: copy_ranges are their bucket ranges).
  std::vector<Tensor> step_params, step_grads, step_copies;
  std::vector<std::vector<Tensor>> step_states;
  std::vector<std::string> step_names;
  std::vector<std::pair<int64_t, int64_t>> copy_ranges;
  WorkPtr gather_work;           // the all-gather in flight
  bool gather_pending = false;   // launched, parameters not written yet
  // consolidate(): the whole bucket's master and states (allocated lazily).
  dp::FusionBuffer full_master;
  std::vector<dp::FusionBuffer> full_states;
};

// The state names of an optimizer kind, as torch.optim calls them.
std::vector<std::string> state_names(optim::Kind kind);

// What this process's last remap() moved (zero_remap.cc), for the scale
// tests (tests/scale/dp.cmake): bytes to and from other ranks (its own
// pieces move in place and are not counted), messages sent, and the most
// peers it sent to or received from.
struct RemapCost {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t peers = 0;
};
RemapCost last_remap_cost();

}  // namespace zero

class ShardedOptimizerImpl {
 public:
  ShardedOptimizerImpl(Reducer& reducer, const optim::Hyper& hyper,
                       ShardedOptimizerOptions options);
  ~ShardedOptimizerImpl();

  void step(float grad_scale, void* stream);
  std::vector<Tensor> gradient_shards() const;
  // Block r of every bucket's gather buffer = round(master); all-gather;
  // copy into the parameters.  CUDA: on `stream`.
  void write_parameters(void* stream);
  // Per bucket, last first: take a gather buffer, update the shard with
  // `hyper` (or, null, round the master weights into it), launch the
  // all-gather.  zero_gather.cc.
  void launch_gathers(void* stream, const optim::Hyper* hyper, float grad_scale);
  void finish_gather(size_t bucket);
  void wait_parameters();
  void wait_parameter(int index);
  StateDict state_dict();
  StateDict consolidate();
  int64_t state_bytes() const;
  int64_t unsharded_state_bytes() const;
  int64_t gradient_bytes() const;
  int64_t gather_bytes() const;

  Reducer& reducer_;
  optim::Hyper hyper_;
  ShardedOptimizerOptions opt_;
  int64_t steps_ = 0;
  std::vector<ZeroShard> shards_;
  std::vector<zero::Bucket> buckets_;

 private:
  std::string validate() const;
  void check_agreement(const std::string& local_error);
  void build_layout();
  void setup_bucket(int index, bool pool_gathers);
  void install_collective();
  void on_plan_fixed(bool replanned);
  // The reducer re-planned its buckets: every parameter's master weights,
  // states and (stage 2) gradient shard move from (old bucket, offset) to
  // (new bucket, offset), each rank sending and receiving only its own
  // shard's pieces (point-to-point on the group); collective
  // (zero_remap.cc).
  void remap();
  // Bucket z's flat array of which this rank holds `mine` (its z.owned
  // elements) gathered whole into `whole` (allocated on first use, numel
  // elements of mine's dtype): allgatherv of the uneven shards; collective
  // (consolidate).
  void gather_whole(const zero::Bucket& z, const dp::FusionBuffer& mine, dp::FusionBuffer& whole,
                    const OpOptions& o);
  // CUDA buckets: waits for the default stream (where gather_whole's copies
  // ran) before the host reads or frees what they wrote.  No-op on the host.
  void sync_default_stream() const;
  WorkPtr reduce_scatter(int bucket, const Tensor& flat, const OpOptions& o);
  void build_step_lists();
  bool gather_pooled() const { return !gather_pool_.empty(); }
  void acquire_gather(size_t bucket, void* stream);
  void release_gather(zero::Bucket& z);

  int world_ = 1;
  int rank_ = 0;
  int64_t reduced_steps_ = 0;  // reducer.stats().steps at the last step()
  bool listening_ = false;     // the reducer's plan listener is ours
  void* gather_stream_ = nullptr;  // the stream the all-gathers were launched on
  std::vector<int> param_bucket_;  // reducer parameter index -> bucket
  HostBufferPool pool_;
  std::vector<Tensor> grads_;  // every bucket's step_grads (gradient_shards())
  // Pooled all-gather buffers (empty: every bucket owns one).
  std::vector<std::unique_ptr<dp::PoolSlot>> gather_pool_;
  std::vector<int> gather_free_;
  int64_t gather_slot_bytes_ = 0;
};

}  // namespace tutti
