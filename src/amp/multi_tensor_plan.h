// Splits a list of tensors into launches of tutti's multi-tensor kernels.
//
// Every non-empty tensor is cut into chunks of MtaTable::kChunk elements;
// each chunk becomes one thread block.  A launch holds at most kMaxTensors
// tensor slots and kMaxBlocks blocks; a tensor whose chunks do not fit
// continues in the next launch (it then occupies a slot in both).  Each
// (tensor, chunk) is planned exactly once, in list order, so a kernel that
// writes per-chunk partial results at chunk_base + chunk fills a dense array
// of total_chunks() entries.  Plain host code: the planner is tested on
// machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/amp_multi_tensor.h"

namespace tutti {
namespace amp {

struct MtaEntry {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t numel = 0;
  uint8_t src_dtype = kMtaF32;
  uint8_t dst_dtype = kMtaF32;
  float prescale = 1.0f;
};

class MtaPlanner {
 public:
  // `entries` must outlive the planner; entry i is tensor index i.
  explicit MtaPlanner(const std::vector<MtaEntry>& entries);
  // Chunks over all tensors (the size of a per-chunk partial array).
  int64_t total_chunks() const { return total_chunks_; }
  // Fills the next launch; false once every chunk was planned.
  bool next(MtaTable* table);

 private:
  const std::vector<MtaEntry>& entries_;
  int64_t total_chunks_ = 0;
  size_t tensor_ = 0;  // the tensor being planned
  int64_t chunk_ = 0;  // its next chunk
  int64_t base_ = 0;   // global chunk number of its chunk 0
};

// Launcher argument check: block and slot counts within the limits, every
// block's slot valid, dtype codes known (the destination's too when
// `uses_dst`).  Error(kInvalidArgument) naming `kernel`.
void check_table(const MtaTable& table, const char* kernel, bool uses_dst);

// Chunks of a tensor of n elements.
inline int64_t mta_chunks(int64_t n) {
  return (n + MtaTable::kChunk - 1) / MtaTable::kChunk;
}

}  // namespace amp
}  // namespace tutti
