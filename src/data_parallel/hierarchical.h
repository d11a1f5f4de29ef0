// Hierarchical sum all-reduce of a flat bucket: within a node, then across
// nodes, then within the node again, so that only 1/node_size of the bucket
// crosses the (slower) inter-node network per rank.
//
// Nodes of equal size (the usual case):
//   reduce-scatter (sum) within the node  -> each rank holds one summed shard
//   all-reduce (sum) of the shard across nodes (ranks with the same local
//     rank on every node)
//   all-gather of the shards within the node
// Nodes of unequal size (shards would not line up across nodes):
//   all-reduce within the node -> all-reduce among the node leaders (local
//   rank 0) -> broadcast from the leader within the node.
// Every element's final value is computed once and then copied (or by the
// backend's all-reduce, which returns the same bits on every rank), so the
// result is bit-identical on every rank of the group.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/process_group.h"

namespace tutti {
namespace dp {

class HierarchicalAllreduce {
 public:
  // Collective over `group`.  node_size > 0: consecutive groups of
  // node_size ranks of `group` are the nodes (the last may be smaller);
  // 0: MPI's shared-memory split (group->node_group()).
  HierarchicalAllreduce(const ProcessGroupPtr& group, int node_size);

  // Bucket length to allocate for `numel` elements: a multiple of the node
  // size in the equal-node scheme (the tail stays zero).
  int64_t padded_numel(int64_t numel) const;
  // Elements of the per-bucket shard buffer (0 in the unequal scheme).
  int64_t shard_numel(int64_t padded) const;
  int local_size() const { return node_->size(); }

  // Sums `bucket` (padded_numel elements) over the group in place, using
  // `shard` (shard_numel elements) as scratch.  Blocking; CUDA: ordered on
  // `stream`.
  void allreduce_sum(const Tensor& bucket, const Tensor& shard,
                     const std::string& name, void* stream);

  // allreduce_sum() in two halves, so that a caller can pipeline buckets:
  // begin() runs the node stage and starts the cross-node all-reduce
  // without waiting (its Work; null when this rank has no cross-node part);
  // finish() waits for it and runs the node all-gather / broadcast.  Every
  // rank must call the halves of all buckets in the same order (the reducer:
  // begin(k), finish(k - 1), so the cross-node all-reduce of bucket k - 1
  // overlaps the node stage of bucket k).  The buffers stay in use until
  // finish() returned.
  WorkPtr begin(const Tensor& bucket, const Tensor& shard, const std::string& name,
                void* stream);
  void finish(const Tensor& bucket, const Tensor& shard, const std::string& name,
              void* stream, const WorkPtr& cross);

 private:
  ProcessGroupPtr node_;
  ProcessGroupPtr cross_;  // same local rank on every node (null if unused)
  bool equal_ = true;
  int nodes_ = 1;
};

}  // namespace dp
}  // namespace tutti
