// Global gradient norm over a model replica split across the TP group.
//
// A sharded gradient's squared norm is a sum over disjoint slices, so the
// replica's total is the TP all-reduce of the per-rank sums.  A replicated
// gradient (RowParallelLinear's bias) is identical on every TP rank, so
// adding it into the all-reduce would count it tp_size times: it is added
// once, after the reduction.  After data-parallel averaging the gradients are
// the same in every replica, so no DP reduction is needed.
#include "core/check.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {

double tp_grad_norm_squared(const ProcessMesh& mesh,
                            const std::vector<TPParameter>& params,
                            void* stream) {
  double sharded = 0, replicated = 0;
  for (const TPParameter& p : params) {
    TUTTI_ARG_CHECK(p.grad.numel() == p.value.numel(),
                    "tp_grad_norm_squared: '", p.name, "' has gradient ",
                    p.grad.str(), " for value ", p.value.str());
    (p.tp_replicated() ? replicated : sharded) +=
        tp::sum_squares(p.grad, stream);
  }
  tp::allreduce(*mesh.impl(), Tensor::of(&sharded, 1), ReduceOp::kSum,
                "tp_grad_norm_squared: sharded gradients", nullptr);
  return sharded + replicated;
}

}  // namespace tutti
