// Host side of the CUDA multi-tensor operations: plans the launches, owns
// the small device buffers (flags, partial norms) for the duration of one
// call, and waits for the stream, because the caller needs the flag or the
// norm on the host to decide the step.
#pragma once

#include <vector>

#include "amp/multi_tensor_plan.h"
#include "tutti/amp.h"

namespace tutti {
namespace amp {

// The CUDA twin of a loop of cpu_scale_copy() over `entries` (all on
// `device`).  Error(kUnsupported) in a build without CUDA.
NonFiniteReport cuda_scale_copy(const std::vector<MtaEntry>& entries,
                                int device, float scale, void* stream);

// Per entry: float64 sum of the float32 chunk sums of (x * prescale)^2, and
// the max |x * prescale| (NaN when there is a NaN).
void cuda_norms(const std::vector<MtaEntry>& entries, int device, void* stream,
                std::vector<double>* sum_squares, std::vector<double>* max_abs);

}  // namespace amp
}  // namespace tutti
