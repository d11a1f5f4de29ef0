// The launch table of tutti's multi-tensor kernels (scale/cast/check and
// norms): which tensors one launch touches and which chunk each thread block
// processes.  Plain data shared by the host planner (src/amp/
// multi_tensor_plan.h) and the kernels; it travels as the kernel argument,
// so it stays below the 4 KiB that every CUDA architecture accepts and no
// device-side table has to be copied or kept alive.
#pragma once

#include <cstdint>

namespace tutti {
namespace amp {

// Element types the kernels understand (the DType values, so a cast is
// enough).
enum MtaDType : uint8_t { kMtaF32 = 0, kMtaF16 = 1, kMtaBF16 = 2 };

struct MtaTable {
  static constexpr int kMaxTensors = 48;
  static constexpr int kMaxBlocks = 320;
  // Elements per chunk (one thread block each).  A multiple of 4 so that
  // every chunk of an aligned tensor starts aligned for vector access.
  static constexpr int64_t kChunk = 65536;

  // Per tensor slot.
  const void* src[kMaxTensors];
  void* dst[kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t index[kMaxTensors];       // position in the caller's list
  int32_t chunk_base[kMaxTensors];  // global chunk number of chunk 0
  float prescale[kMaxTensors];      // norms: x * prescale is summed
  uint8_t src_dtype[kMaxTensors];   // MtaDType
  uint8_t dst_dtype[kMaxTensors];
  // Per block.
  uint8_t block_slot[kMaxBlocks];   // tensor slot
  int32_t block_chunk[kMaxBlocks];  // chunk number within that tensor
  int32_t n_tensors;
  int32_t n_blocks;
};

static_assert(sizeof(MtaTable) <= 4096, "kernel argument limit");
static_assert(MtaTable::kChunk % 4 == 0, "vector alignment of chunks");
static_assert(MtaTable::kMaxTensors <= 256, "block_slot is 8 bits");

}  // namespace amp
}  // namespace tutti
