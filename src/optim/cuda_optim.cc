#include "optim/cuda_optim.h"

#include "core/check.h"
#include "core/cuda_utils.h"

#include "amp/multi_tensor_plan.h"
#include "kernels/optim_step.h"

namespace tutti {
namespace optim {

namespace {

uint8_t code_of(DType d) {
  return d == DType::kFloat32 ? amp::kMtaF32
         : d == DType::kFloat16 ? amp::kMtaF16 : amp::kMtaBF16;
}

}  // namespace

void fill_opt_table(const amp::MtaTable& mta, const std::vector<Entry>& entries,
                    OptTable* t) {
  t->n_tensors = mta.n_tensors;
  t->n_blocks = mta.n_blocks;
  for (int k = 0; k < mta.n_tensors; ++k) {
    const Entry& e = entries.at(static_cast<size_t>(mta.index[k]));
    t->param[k] = e.param;
    t->grad[k] = e.grad;
    t->state0[k] = e.state0;
    t->state1[k] = e.state1;
    t->copy[k] = e.copy;
    t->numel[k] = e.numel;
    t->grad_dtype[k] = code_of(e.grad_dtype);
    t->copy_dtype[k] = code_of(e.copy_dtype);
  }
  for (int b = 0; b < mta.n_blocks; ++b) {
    t->block_slot[b] = mta.block_slot[b];
    t->block_chunk[b] = mta.block_chunk[b];
  }
}

std::vector<amp::MtaEntry> plan_entries(const std::vector<Entry>& entries) {
  // The planner only needs element counts; src/dst name the entry's
  // gradient and parameter for clarity.
  std::vector<amp::MtaEntry> plan(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    plan[i].src = entries[i].grad;
    plan[i].dst = entries[i].param;
    plan[i].numel = entries[i].numel;
  }
  return plan;
}

void check_opt_table(const OptTable& t, const Coeffs& c) {
  TUTTI_ARG_CHECK(t.n_blocks > 0 && t.n_blocks <= OptTable::kMaxBlocks,
                  "optim_step: ", t.n_blocks, " blocks (1..", OptTable::kMaxBlocks, ")");
  TUTTI_ARG_CHECK(t.n_tensors > 0 && t.n_tensors <= OptTable::kMaxTensors,
                  "optim_step: ", t.n_tensors, " tensors (1..", OptTable::kMaxTensors, ")");
  TUTTI_ARG_CHECK(c.kind <= 2, "optim_step: optimizer kind code ", int(c.kind));
  for (int b = 0; b < t.n_blocks; ++b)
    TUTTI_ARG_CHECK(t.block_slot[b] < t.n_tensors, "optim_step: block ", b,
                    " names slot ", int(t.block_slot[b]), " of ", t.n_tensors);
  const bool needs_s0 = c.kind != 0 || c.has_momentum;
  for (int s = 0; s < t.n_tensors; ++s) {
    TUTTI_ARG_CHECK(t.grad_dtype[s] <= amp::kMtaBF16 && t.copy_dtype[s] <= amp::kMtaBF16,
                    "optim_step: slot ", s, " has dtype codes ", int(t.grad_dtype[s]),
                    "/", int(t.copy_dtype[s]));
    TUTTI_ARG_CHECK(t.param[s] && t.grad[s] && (t.state0[s] || !needs_s0) &&
                        (t.state1[s] || c.kind == 0),
                    "optim_step: slot ", s, " lacks a parameter, gradient or state "
                    "pointer the step needs");
  }
}

#if TUTTI_WITH_CUDA

void cuda_step(const std::vector<Entry>& entries, const Coeffs& c, int device,
               void* stream) {
  const std::vector<amp::MtaEntry> plan = plan_entries(entries);
  amp::MtaPlanner planner(plan);
  if (planner.total_chunks() == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  amp::MtaTable mta;
  OptTable t;
  while (planner.next(&mta)) {
    fill_opt_table(mta, entries, &t);
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
