// Do the data-parallel replicas start from the same parameters?
//
// A replica that was never given rank 0's parameters (a forgotten
// broadcast_parameters()) trains on its own copy: the gradients are averaged,
// the parameters drift apart, and nothing fails.  The reducer checks once, at
// the end of its first reducing synchronize() (before the optimiser's first
// step; every rank of the group is in that call):
//  1. each rank digests every registered parameter's bytes (64 bits each;
//     CUDA parameters are copied to the host in chunks first) and one digest
//     of those digests;
//  2. one all-reduce MAX of (digest, ~digest) on the group's host
//     communicator (16 bytes): max == ~max(~) exactly when every rank's
//     digest is the same, so all ranks take the same branch;
//  3. else rank 0 broadcasts its per-parameter digests, one all-reduce MAX
//     of one flag byte per parameter and per rank finds the parameters that
//     differ and the ranks that hold a differing copy, and one more (a byte
//     per rank) the ranks whose copy of the first such parameter differs;
//     every rank raises the same kMismatch naming that parameter and the
//     ranks (as ranges past TUTTI_REPORT_MAX_RANKS).  No rank gathers the
//     others' digests: O(parameters + W) bytes and a fixed number of
//     collectives per rank, whatever W.
// Over the reducer's own group only: in a ProcessMesh that is the
// data-parallel group, whose members hold replicas of the same tensor-parallel
// shard (shards legitimately differ across the tensor-parallel group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/tensor.h"

namespace tutti {
namespace dp {

// 64-bit digest of `bytes` bytes (the same on every rank and machine).
uint64_t digest_bytes(const void* data, size_t bytes, uint64_t seed = 0);

// The digest of a parameter's bytes; a CUDA tensor is copied to the host in
// chunks, ordered on `stream` (synchronous: this runs once per reducer).
uint64_t digest_tensor(const Tensor& t, void* stream);

struct ParamEntry {
  std::string name;
  Tensor value;
};

// Collective over `comm` (host tensors only travel): throws Error(kMismatch)
// on every rank when some parameter's bytes differ across ranks, e.g.
// "<context>: the replicas' parameters differ at the first step: parameter
// #1 'fc.weight' float32[4, 3] of rank 1 differs from rank 0's (2 of 5
// parameters differ; ranks 1, 3 differ from rank 0) ...".
void check_parameters_agree(Communicator& comm, const std::string& context,
                            const std::vector<ParamEntry>& params, void* stream);

}  // namespace dp
}  // namespace tutti
