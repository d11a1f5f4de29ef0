// Multi-tensor sum of squares and max-abs per chunk (kernels/amp_norm.cu).
// CPU twin: cpu_norm() in src/amp/cpu_multi_tensor.h.
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/amp_multi_tensor.h"

namespace tutti {
namespace amp {

// One launch over the chunks of `table`: for each chunk, partials[g] =
// (float32 sum of (x * prescale)^2, max |x * prescale|) where g =
// chunk_base[slot] + chunk.  The max is NaN when the chunk holds a NaN.
// `partials` holds at least the planner's total_chunks() entries.
void launch_amp_norm_partials(const MtaTable& table, float2* partials,
                              cudaStream_t stream);

}  // namespace amp
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
