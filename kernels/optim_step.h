// Fused multi-tensor optimizer step (kernels/optim_step.cu).
// CPU twin: cpu_step() in src/optim/cpu_optim.h; both run optim_math.h.
#pragma once

#include <cstdint>

#include "amp/multi_tensor_plan.h"
#include "optim/optim_math.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti {
namespace optim {

// One launch's tensors and blocks, in the layout of amp::MtaTable (the
// planner fills that one; cuda_optim.cc copies its block list and looks up
// each slot's pointers).  Five pointers per slot: the table plus the step's
// Coeffs stay below the 4 KiB kernel-argument limit of every architecture.
struct OptTable {
  static constexpr int kMaxTensors = amp::MtaTable::kMaxTensors;
  static constexpr int kMaxBlocks = amp::MtaTable::kMaxBlocks;
  static constexpr int64_t kChunk = amp::MtaTable::kChunk;

  float* param[kMaxTensors];
  const void* grad[kMaxTensors];
  float* state0[kMaxTensors];  // null: SGD without momentum
  float* state1[kMaxTensors];  // null: SGD
  void* copy[kMaxTensors];     // null: no model copy
  int64_t numel[kMaxTensors];
  uint8_t grad_dtype[kMaxTensors];  // amp::MtaDType
  uint8_t copy_dtype[kMaxTensors];
  uint8_t block_slot[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
  int32_t n_tensors;
  int32_t n_blocks;
};

static_assert(sizeof(OptTable) + sizeof(Coeffs) <= 4096, "kernel argument limit");

#if TUTTI_WITH_CUDA
// One launch over the chunks of `table`: every element of every slot gets
// optim_math.h's update (c.kind selects SGD or Adam/AdamW), then its model
// copy, if any, the rounded parameter.  Checks the table (block and slot
// counts, slots, dtype codes, the pointers the kind needs) and the launch;
// errors name the slot and the CUDA error.
void launch_optim_step(const OptTable& table, const Coeffs& c,
                       cudaStream_t stream);
#endif

}  // namespace optim
}  // namespace tutti
