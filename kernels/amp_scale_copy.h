// Multi-tensor scale + cast + non-finite check (kernels/amp_scale_copy.cu).
// CPU twin: cpu_scale_copy() in src/amp/cpu_multi_tensor.h.
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/amp_multi_tensor.h"

namespace tutti {
namespace amp {

// One launch over the chunks of `table`: dst = round_dst(float(src) * scale)
// for every element, then flags[table.index[slot]] = 1 for every tensor a
// block wrote a NaN or Inf into (flags are only ever set, never cleared).
// A slot whose src == dst with equal dtypes and scale == 1 is only read.
void launch_amp_scale_copy(const MtaTable& table, float scale, int32_t* flags,
                           cudaStream_t stream);

}  // namespace amp
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
