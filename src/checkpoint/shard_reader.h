// Reading stored tensor bytes: full verification of a shard's data against
// its per-tensor checksums, and the copies a LoadPlan prescribes.
#pragma once

#include "checkpoint/load_plan.h"
#include "checkpoint/shard_files.h"
#include "core/host_buffer.h"

namespace tutti {
namespace ckpt {

// Streams shard s's data region once, checking every tensor's xxHash64.
// kCorrupt naming the shard and the first tensor that differs.
void verify_shard_data(const OpenedCheckpoint& ckpt, int s, ShardFiles& files,
                       HostBufferPool& pool);
// Reads one stored piece whole and checks its xxHash64 (kCorrupt).
void verify_piece(int s, const StoredTensor& piece, ShardFiles& files, HostBufferPool& pool);

// Performs the plan's copies into `dst` that this rank reads itself
// (reader < 0; node_share.h does the others): host tensors by pread straight
// into the tensor where the run is large, through a pooled staging buffer
// otherwise; CUDA tensors through pinned staging and cudaMemcpy.
void execute_plan(const OpenedCheckpoint& ckpt, const LoadPlan& plan, const StateDict& dst,
                  ShardFiles& files, HostBufferPool& pool);

// Copies n host bytes into `dst` at byte `dst_byte` (host or CUDA).
void copy_out(const Tensor& dst, uint64_t dst_byte, const unsigned char* src, size_t n);

}  // namespace ckpt
}  // namespace tutti
