#include "optim/cuda_optim.h"

#include "core/check.h"
#include "core/cuda_utils.h"

#if TUTTI_WITH_CUDA
#include "amp/multi_tensor_plan.h"
#include "kernels/optim_step.h"
#endif

namespace tutti {
namespace optim {

#if TUTTI_WITH_CUDA
namespace {

uint8_t code_of(DType d) {
  return d == DType::kFloat32 ? amp::kMtaF32
         : d == DType::kFloat16 ? amp::kMtaF16 : amp::kMtaBF16;
}

}  // namespace

void cuda_step(const std::vector<Entry>& entries, const Coeffs& c, int device,
               void* stream) {
  // The planner only needs element counts; src names the entry for clarity.
  std::vector<amp::MtaEntry> plan(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    plan[i].src = entries[i].grad;
    plan[i].dst = entries[i].param;
    plan[i].numel = entries[i].numel;
  }
  amp::MtaPlanner planner(plan);
  if (planner.total_chunks() == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  amp::MtaTable mta;
  OptTable t;
  while (planner.next(&mta)) {
    t.n_tensors = mta.n_tensors;
    t.n_blocks = mta.n_blocks;
    for (int k = 0; k < mta.n_tensors; ++k) {
      const Entry& e = entries[static_cast<size_t>(mta.index[k])];
      t.param[k] = e.param;
      t.grad[k] = e.grad;
      t.state0[k] = e.state0;
      t.state1[k] = e.state1;
      t.copy[k] = e.copy;
      t.numel[k] = e.numel;
      t.grad_dtype[k] = code_of(e.grad_dtype);
      t.copy_dtype[k] = code_of(e.copy_dtype);
    }
    for (int b = 0; b < mta.n_blocks; ++b) {
      t.block_slot[b] = mta.block_slot[b];
      t.block_chunk[b] = mta.block_chunk[b];
    }
    launch_optim_step(t, c, s);
  }
}

#else  // !TUTTI_WITH_CUDA

void cuda_step(const std::vector<Entry>&, const Coeffs&, int, void*) {
  TUTTI_THROW(kUnsupported, "optim::step: CUDA tensors need a tutti build with CUDA");
}

#endif

}  // namespace optim
}  // namespace tutti
