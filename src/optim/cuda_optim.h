// Host side of the CUDA optimizer step: plans the launches with amp's
// multi-tensor planner (src/amp/multi_tensor_plan.h), fills the kernel's
// argument table from the entries, and enqueues kernels/optim_step.cu on the
// stream.  No device allocation, no synchronisation: the table travels as the
// kernel argument.
#pragma once

#include <vector>

#include "optim/cpu_optim.h"

namespace tutti {
namespace optim {

// The CUDA twin of a loop of cpu_step() over `entries` (all on `device`).
// Error(kUnsupported) in a build without CUDA.
void cuda_step(const std::vector<Entry>& entries, const Coeffs& c, int device,
               void* stream);

}  // namespace optim
}  // namespace tutti
