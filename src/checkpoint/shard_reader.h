// Reading stored tensor bytes: full verification of a shard's data against
// its per-tensor checksums, and the copies a LoadPlan prescribes.  Both
// spread their work over the load's threads (load_workers.h) and read a
// shard on tmpfs from its mapping (shard_files.h).
#pragma once

#include <vector>

#include "checkpoint/load_plan.h"
#include "checkpoint/load_workers.h"
#include "checkpoint/shard_files.h"
#include "core/host_buffer.h"

namespace tutti {
namespace ckpt {

// Checks every tensor's xxHash64 in shard s's data region (each byte read
// once; tensors hashed in parallel).  kCorrupt naming the shard and the
// first tensor, in the shard's order, that differs.
void verify_shard_data(const OpenedCheckpoint& ckpt, int s, ShardFiles& files,
                       HostBufferPool& pool, LoadWorkers& workers);
// The same for some stored pieces of shard s (each read whole).
void verify_pieces(int s, const std::vector<const StoredTensor*>& pieces, ShardFiles& files,
                   HostBufferPool& pool, LoadWorkers& workers);

// Performs the plan's copies into `dst` that this rank reads itself
// (reader < 0; node_share.h does the others): host runs of 1 MiB or more
// straight into the tensor (memcpy from a mapping or pread), cut among the
// threads; smaller ones gathered through a pooled staging buffer.  CUDA
// tensors through two pinned staging buffers, each filled by the threads
// while the other's cudaMemcpyAsync runs (device_upload.h); every copy has
// landed when it returns.
void execute_plan(const OpenedCheckpoint& ckpt, const LoadPlan& plan, const StateDict& dst,
                  ShardFiles& files, HostBufferPool& pool, LoadWorkers& workers);

// Copies n host bytes into `dst` at byte `dst_byte` (host or CUDA).
void copy_out(const Tensor& dst, uint64_t dst_byte, const unsigned char* src, size_t n);

}  // namespace ckpt
}  // namespace tutti
