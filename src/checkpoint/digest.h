// Digests of replicated state, compared across ranks before a save writes
// a replicated tensor once (election.h).  They never reach a file: a
// mismatch only means every holder writes its own copy.
//
// Host tensors are hashed whole (XXH3, a pass over memory much cheaper than
// the copy it replaces).  CUDA tensors: ReplicaCheck::kSample copies the
// element count and 16 blocks of 64 bytes spread over the tensor to host
// memory (one small copy per tensor, then one host wait for all of them);
// kFull copies each tensor to host and hashes it whole.  Both wait on the
// host until the caller's stream has produced the state.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/election.h"
#include "checkpoint/snapshot.h"
#include "core/host_buffer.h"

namespace tutti {
namespace ckpt {

std::vector<uint64_t> replica_digests(const std::vector<Tensor>& tensors, ReplicaCheck check,
                                      SnapshotCopier& copier, HostBufferPool& pool);

}  // namespace ckpt
}  // namespace tutti
