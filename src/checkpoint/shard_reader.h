// Reading stored tensor bytes: full verification of a shard's data against
// its per-tensor checksums, and the copies a LoadPlan prescribes.
#pragma once

#include "checkpoint/load_plan.h"
#include "core/host_buffer.h"

namespace tutti {
namespace ckpt {

// Streams the data region once, checking every tensor's xxHash64.
// kCorrupt naming the shard and the first tensor that differs.
void verify_shard_data(const ShardIndex& shard, HostBufferPool& pool);

// Performs the plan's copies into `dst` (host tensors: pread straight into
// the tensor where the run is large, through a pooled staging buffer
// otherwise; CUDA tensors: through pinned staging and cudaMemcpy).
void execute_plan(const OpenedCheckpoint& ckpt, const LoadPlan& plan,
                  const StateDict& dst, HostBufferPool& pool);

}  // namespace ckpt
}  // namespace tutti
