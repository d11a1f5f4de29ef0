// A two-dimensional process mesh: tensor parallel (TP) x data parallel (DP).
//
//   auto mesh = std::make_shared<tutti::ProcessMesh>(tutti::world(), 2);
//   // world of 8: TP groups {0,1} {2,3} {4,5} {6,7}, DP groups {0,2,4,6}
//   {1,3,5,7}
//
// TP is the innermost dimension: the ranks of one TP group are consecutive
// world ranks, so with the usual rank-per-GPU placement they share a node and
// the frequent TP collectives stay on NVLink / shared memory.  The DP groups
// connect the ranks that hold the same TP shard (same tp_rank).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tutti/export.h"
#include "tutti/process_group.h"

namespace tutti {

// Bytes the tensor-parallel layers and region operators passed to TP-group
// collectives since the mesh was built (or reset_comm_stats()).  A
// collective counts the size of its full, unsharded buffer: an all-reduce
// its tensor, an all-gather its output, a reduce-scatter its input.  What a
// rank actually sends depends on the algorithm (a ring all-reduce sends
// 2 (p-1)/p of the buffer, a ring all-gather or reduce-scatter (p-1)/p).
// Collectives over a TP group of one rank are skipped and not counted.
struct CommStats {
  uint64_t allreduce_calls = 0;
  uint64_t allreduce_bytes = 0;
  uint64_t allgather_calls = 0;
  uint64_t allgather_bytes = 0;
  uint64_t reduce_scatter_calls = 0;
  uint64_t reduce_scatter_bytes = 0;

  uint64_t calls() const {
    return allreduce_calls + allgather_calls + reduce_scatter_calls;
  }
  uint64_t bytes() const {
    return allreduce_bytes + allgather_bytes + reduce_scatter_bytes;
  }
};

class MeshImpl;

class TUTTI_API ProcessMesh {
 public:
  // Collective over `world`: every rank passes the same tp_size.  Ranks that
  // disagree about tp_size get Error(kMismatch) (on every rank); a tp_size
  // that is not positive or does not divide world->size() is
  // Error(kInvalidArgument) on every rank.  If a TP group spans more than one
  // node, a warning is logged (TP traffic then crosses the network) and
  // tp_within_node() is false.
  ProcessMesh(ProcessGroupPtr world, int tp_size);
  ~ProcessMesh();
  ProcessMesh(const ProcessMesh&) = delete;
  ProcessMesh& operator=(const ProcessMesh&) = delete;

  int tp_size() const;
  int dp_size() const;
  // This rank's position: world rank == dp_rank * tp_size + tp_rank.
  int tp_rank() const;
  int dp_rank() const;

  const ProcessGroupPtr& world() const;
  // The tp_size ranks holding the shards of one model replica ("tp").
  const ProcessGroupPtr& tp_group() const;
  // The dp_size ranks holding the same shard in different replicas ("dp").
  const ProcessGroupPtr& dp_group() const;

  // Rank in world() of the process at (dp_rank, tp_rank).
  int rank_of(int dp_rank, int tp_rank) const;
  // True when every TP group lies within one node (MPI shared-memory
  // domain).
  bool tp_within_node() const;
  // "TP 2 x DP 2"
  std::string str() const;

  // Traffic of TP-group collectives issued through this mesh (see
  // CommStats).  Thread-safe.
  CommStats comm_stats() const;
  void reset_comm_stats();

  // Internal state (scratch buffers, counters) shared by the TP layers.
  MeshImpl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<MeshImpl> impl_;
};

using ProcessMeshPtr = std::shared_ptr<ProcessMesh>;

}  // namespace tutti
