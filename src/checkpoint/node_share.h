// Replicated state read once per node.
//
// In the once layout every chunk of a replicated tensor lies in one shard,
// and every rank needs all of them: read naively, each rank would open
// every writer's shard.  Instead the ranks of a node (the manager's node
// group, MPI_COMM_TYPE_SHARED) split those reads: each source piece is read
// by one rank of the node (all of a shard's by the same rank, preferably
// the one that verifies that shard), which verifies its checksum before the
// load's agreement, and after it reads the piece into its tensor and broadcasts
// the bytes to the node's other ranks (shared memory, in chunks of at most
// kShareChunk; CUDA tensors through host staging).  Storage then sees each
// replicated byte once per node, and the node opens each shard once.
//
// Shared: a destination that is replicated (not split, flat or per-rank) on
// every rank of the node -- agreed once per load by a fingerprint of those
// tensors (agree_shareable) -- whose stored tensor is stored once (no two
// pieces overlap: not a per-rank copy), each of its pieces landing as one
// contiguous range.  Everything else each rank reads itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/agreement.h"
#include "checkpoint/load_plan.h"
#include "checkpoint/shard_files.h"
#include "core/host_buffer.h"

namespace tutti {
namespace ckpt {

constexpr uint64_t kShareChunk = 64ull << 20;

// Collective over the node group `node_agree` runs on: true when every
// rank of the node holds the same replicated destinations (names, dtypes,
// shapes) in `dst`.
bool agree_shareable(Agreement& node_agree, const StateDict& dst);

// Marks the sources of shared destinations with the node rank that reads
// them (PieceCopies::reader), in a way every rank of the node computes
// alike: all the shared pieces of one shard go to one reader (so the node
// opens each shard once), the rank of the node that verifies that shard in
// full anyway if there is one (`verifier[s]`: its node rank, or -1), else
// the node rank with the fewest bytes so far.
void assign_node_reads(LoadPlan* plan, const OpenedCheckpoint& ckpt, const StateDict& dst,
                       const std::vector<int>& verifier, int node_size);

// Collective over the node: every shared source in that order, read by its
// reader and broadcast to the others.  A read error does not stop the
// broadcasts (the node stays in step); the first one is returned ("" when
// none) and fails the load's agreement that follows.
std::string execute_node_reads(const LoadPlan& plan, const StateDict& dst,
                               Agreement& node_agree, ShardFiles& files, HostBufferPool& pool);

}  // namespace ckpt
}  // namespace tutti
