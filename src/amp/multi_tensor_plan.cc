#include "amp/multi_tensor_plan.h"

#include <limits>

#include "core/check.h"

namespace tutti {
namespace amp {

MtaPlanner::MtaPlanner(const std::vector<MtaEntry>& entries)
    : entries_(entries) {
  TUTTI_ARG_CHECK(entries.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                  "multi-tensor list of ", entries.size(), " tensors is too long");
  for (const MtaEntry& e : entries) {
    TUTTI_CHECK(e.numel >= 0);
    total_chunks_ += mta_chunks(e.numel);
  }
  // chunk_base and block_chunk are 32-bit in the kernel argument.
  TUTTI_ARG_CHECK(total_chunks_ <= std::numeric_limits<int32_t>::max(),
                  "multi-tensor list of ", total_chunks_, " chunks of ",
                  MtaTable::kChunk, " elements exceeds the 2^31 chunk limit");
}

bool MtaPlanner::next(MtaTable* t) {
  t->n_tensors = 0;
  t->n_blocks = 0;
  while (tensor_ < entries_.size()) {
    const MtaEntry& e = entries_[tensor_];
    const int64_t chunks = mta_chunks(e.numel);
    if (chunks == 0) {
      ++tensor_;
      continue;
    }
    const int32_t index = static_cast<int32_t>(tensor_);
    if (t->n_tensors == 0 || t->index[t->n_tensors - 1] != index) {
      if (t->n_tensors == MtaTable::kMaxTensors) return true;
      const int s = t->n_tensors++;
      t->src[s] = e.src;
      t->dst[s] = e.dst;
      t->numel[s] = e.numel;
      t->index[s] = index;
      t->chunk_base[s] = static_cast<int32_t>(base_);
      t->prescale[s] = e.prescale;
      t->src_dtype[s] = e.src_dtype;
      t->dst_dtype[s] = e.dst_dtype;
    }
    const uint8_t slot = static_cast<uint8_t>(t->n_tensors - 1);
    while (chunk_ < chunks && t->n_blocks < MtaTable::kMaxBlocks) {
      t->block_slot[t->n_blocks] = slot;
      t->block_chunk[t->n_blocks] = static_cast<int32_t>(chunk_++);
      ++t->n_blocks;
    }
    if (chunk_ == chunks) {
      base_ += chunks;
      chunk_ = 0;
      ++tensor_;
    }
    // A new slot is only opened while blocks remain, so every slot of a
    // returned table has at least one block.
    if (t->n_blocks == MtaTable::kMaxBlocks) return true;
  }
  return t->n_blocks > 0;
}

void check_table(const MtaTable& t, const char* kernel, bool uses_dst) {
  TUTTI_ARG_CHECK(t.n_blocks > 0 && t.n_blocks <= MtaTable::kMaxBlocks, kernel,
                  ": ", t.n_blocks, " blocks (1..", MtaTable::kMaxBlocks, ")");
  TUTTI_ARG_CHECK(t.n_tensors > 0 && t.n_tensors <= MtaTable::kMaxTensors, kernel,
                  ": ", t.n_tensors, " tensors (1..", MtaTable::kMaxTensors, ")");
  for (int b = 0; b < t.n_blocks; ++b)
    TUTTI_ARG_CHECK(t.block_slot[b] < t.n_tensors, kernel, ": block ", b,
                    " names slot ", int(t.block_slot[b]), " of ", t.n_tensors);
  for (int s = 0; s < t.n_tensors; ++s)
    TUTTI_ARG_CHECK(t.src_dtype[s] <= kMtaBF16 && (!uses_dst || t.dst_dtype[s] <= kMtaBF16),
                    kernel, ": tensor #", t.index[s], " has dtype codes ",
                    int(t.src_dtype[s]), "/", int(t.dst_dtype[s]));
}

}  // namespace amp
}  // namespace tutti
