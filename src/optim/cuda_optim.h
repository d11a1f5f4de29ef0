// Host side of the CUDA optimizer step: plans the launches with amp's
// multi-tensor planner (src/amp/multi_tensor_plan.h), fills the kernel's
// argument table from the entries, and enqueues kernels/optim_step.cu on the
// stream.  No device allocation, no synchronisation: the table travels as the
// kernel argument.
#pragma once

#include <vector>

#include "amp/multi_tensor_plan.h"
#include "kernels/optim_step.h"
#include "optim/cpu_optim.h"

namespace tutti {
namespace optim {

// The planner's view of `entries` (element counts, in list order).
std::vector<amp::MtaEntry> plan_entries(const std::vector<Entry>& entries);

// One launch's kernel table: the planner's block list, and each slot's
// pointers and dtypes looked up from entries[mta.index[slot]].  Plain host
// code (tested without a GPU).
void fill_opt_table(const amp::MtaTable& mta, const std::vector<Entry>& entries,
                    OptTable* t);

// The launcher's argument check (launch_optim_step calls it): block and
// slot counts within the limits, every block's slot valid, dtype codes
// known, the pointers the kind needs present.  Error(kInvalidArgument)
// naming the slot.
void check_opt_table(const OptTable& t, const Coeffs& c);

// The CUDA twin of a loop of cpu_step() over `entries` (all on `device`).
// Error(kUnsupported) in a build without CUDA.
void cuda_step(const std::vector<Entry>& entries, const Coeffs& c, int device,
               void* stream);

}  // namespace optim
}  // namespace tutti
