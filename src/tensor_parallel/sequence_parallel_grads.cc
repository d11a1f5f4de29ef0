// Gradients of parameters in the sequence-parallel region that are not
// TP-sharded (tutti/tensor_parallel.h: allreduce_sequence_parallel_grads).
//
// With sequence parallelism a LayerNorm sees only this rank's [s/p, b, h]
// slice, so its weight/bias gradient is this slice's contribution; the
// dense gradient is the sum over the TP group.  Each gradient is one
// all-reduce (they are small: 2 h per LayerNorm); tutti.torch coalesces
// them into one buffer per dtype and device before calling this.
#include <string>
#include <vector>

#include "core/check.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {

void allreduce_sequence_parallel_grads(const ProcessMesh& mesh,
                                       const std::vector<Tensor>& grads,
                                       void* stream) {
  return tp::fail_fast(
      *mesh.impl(), grads.empty() ? Device::cpu() : grads.front().device(),
      std::string("allreduce_sequence_parallel_grads"), [&] {
        for (size_t i = 0; i < grads.size(); ++i) {
          TUTTI_ARG_CHECK(grads[i].data() != nullptr || grads[i].numel() == 0,
                          "allreduce_sequence_parallel_grads: grads[", i,
                          "] has no memory");
          TUTTI_ARG_CHECK(grads[i].device() == grads.front().device(),
                          "allreduce_sequence_parallel_grads: grads[", i,
                          "] is on ", grads[i].device().str(), ", grads[0] on ",
                          grads.front().device().str());
        }
        for (size_t i = 0; i < grads.size(); ++i) {
          if (grads[i].numel() == 0) continue;
          tp::allreduce(*mesh.impl(), grads[i], ReduceOp::kSum,
                        "allreduce_sequence_parallel_grads: grads[" +
                            std::to_string(i) + "] " + grads[i].str(),
                        stream);
        }
      });
}

}  // namespace tutti
