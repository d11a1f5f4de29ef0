// Global gradient norm over a model replica split across the TP group.
//
// A sharded gradient's squared norm is a sum over disjoint slices, so the
// replica's total is the TP all-reduce of the per-rank sums.  A replicated
// gradient (RowParallelLinear's bias) is identical on every TP rank, so
// adding it into the all-reduce would count it tp_size times: it is added
// once, after the reduction.  The sum is deterministic: the same gradients
// give the same bits on every run (tensor_parallel/ops.h).  After data-parallel averaging the gradients are
// the same in every replica, so no DP reduction is needed.
#include <vector>

#include "core/check.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {

double tp_grad_norm_squared(const ProcessMesh& mesh,
                            const std::vector<TPParameter>& params,
                            void* stream) {
  return tp::fail_fast(
      *mesh.impl(),
      params.empty() ? Device::cpu() : params.front().grad.device(),
      std::string("tp_grad_norm_squared"), [&] {
        std::vector<Tensor> grads;
        grads.reserve(params.size());
        for (const TPParameter& p : params) {
          TUTTI_ARG_CHECK(p.grad.numel() == p.value.numel(),
                          "tp_grad_norm_squared: '", p.name, "' has gradient ",
                          p.grad.str(), " for value ", p.value.str());
          TUTTI_ARG_CHECK(
              grads.empty() || p.grad.device() == grads.front().device(),
              "tp_grad_norm_squared: '", p.name, "' is on ",
              p.grad.device().str(), ", the first parameter on ",
              grads.front().device().str());
          grads.push_back(p.grad);
        }
        // Per-parameter sums computed on the device without atomics and read
        // back together (one sync), then added here in parameter order: the
        // result has the same bits on every run.
        std::vector<double> sums(grads.size());
        tp::sum_squares(grads, sums.data(), stream);
        double sharded = 0, replicated = 0;
        for (size_t i = 0; i < params.size(); ++i)
          (params[i].tp_replicated() ? replicated : sharded) += sums[i];
        tp::allreduce(*mesh.impl(), Tensor::of(&sharded, 1), ReduceOp::kSum,
                      "tp_grad_norm_squared: sharded gradients", nullptr);
        return sharded + replicated;
      });
}

}  // namespace tutti
