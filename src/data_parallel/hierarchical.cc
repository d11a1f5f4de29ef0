#include "data_parallel/hierarchical.h"

#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace dp {

HierarchicalAllreduce::HierarchicalAllreduce(const ProcessGroupPtr& group,
                                             int node_size) {
  TUTTI_ARG_CHECK(node_size >= 0, "hierarchical_node_size ", node_size,
                  " must be >= 0");
  const int rank = group->rank();
  if (node_size > 0) {
    node_ = group->split_group(rank / node_size, rank, group->name() + "/node");
    cross_ = group->split_group(rank % node_size, rank, group->name() + "/cross");
  } else {
    node_ = group->node_group();
    cross_ = group->cross_node_group();
  }
  // Equal nodes iff min(node size) == max(node size); count the nodes by
  // summing 1 per leader.
  int32_t mn[2] = {node_->size(), -node_->size()};
  group->cpu_communicator()->allreduce(Tensor::of(mn, 2), ReduceOp::kMin,
                                       {"hierarchical node sizes"});
  int32_t leaders = node_->rank() == 0 ? 1 : 0;
  group->cpu_communicator()->allreduce(Tensor::of(&leaders, 1), ReduceOp::kSum,
                                       {"hierarchical node count"});
  equal_ = mn[0] == -mn[1];
  nodes_ = leaders;
  TUTTI_LOG(kInfo) << "hierarchical all-reduce on '" << group->name() << "': "
                   << nodes_ << " node(s) of " << (equal_ ? "equal" : "unequal")
                   << " size, this node has " << node_->size() << " rank(s)";
}

int64_t HierarchicalAllreduce::padded_numel(int64_t numel) const {
  if (!equal_) return numel;
  const int64_t n = node_->size();
  return (numel + n - 1) / n * n;
}

int64_t HierarchicalAllreduce::shard_numel(int64_t padded) const {
  return equal_ ? padded / node_->size() : 0;
}

WorkPtr HierarchicalAllreduce::begin(const Tensor& bucket, const Tensor& shard,
                                     const std::string& name, void* stream) {
  OpOptions o;
  o.stream = stream;
  if (equal_) {
    TUTTI_CHECK_EQ(shard.numel() * node_->size(), bucket.numel());
    o.name = name + " (node reduce-scatter)";
    node_->reduce_scatter(bucket, shard, ReduceOp::kSum, o);
    if (cross_->size() == 1) return nullptr;
    o.name = name + " (cross-node all-reduce)";
    return cross_->allreduce_async(shard, shard, ReduceOp::kSum, o);
  }
  o.name = name + " (node all-reduce)";
  node_->allreduce(bucket, ReduceOp::kSum, o);
  if (node_->rank() != 0 || cross_->size() == 1) return nullptr;
  o.name = name + " (leader all-reduce)";
  return cross_->allreduce_async(bucket, bucket, ReduceOp::kSum, o);
}

void HierarchicalAllreduce::finish(const Tensor& bucket, const Tensor& shard,
                                   const std::string& name, void* stream,
                                   const WorkPtr& cross) {
  if (cross) cross->wait();
  OpOptions o;
  o.stream = stream;
  if (equal_) {
    o.name = name + " (node all-gather)";
    node_->allgather(shard, bucket, o);
    return;
  }
  o.name = name + " (node broadcast)";
  node_->broadcast(bucket, 0, o);
}

void HierarchicalAllreduce::allreduce_sum(const Tensor& bucket,
                                          const Tensor& shard,
                                          const std::string& name,
                                          void* stream) {
  finish(bucket, shard, name, stream, begin(bucket, shard, name, stream));
}

}  // namespace dp
}  // namespace tutti
