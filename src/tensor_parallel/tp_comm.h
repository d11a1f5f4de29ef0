// The collectives of tensor parallelism, on a mesh's TP group.
//
// Every TP-group collective that the layers and region operators issue goes
// through these functions, which count the bytes (ProcessMesh::comm_stats)
// and skip communication when tp_size is 1.  Every public TP entry point
// runs inside fail_fast() (below).  Tensors are 2-D [rows, cols]
// views; "rows" is the flattened leading (sequence/batch) dimensions and
// "cols" the last (hidden) dimension.  `what` names the operation in error
// messages ("ColumnParallelLinear 'fc1' backward: input grad").
#pragma once

#include <cstdint>
#include <string>

#include "tensor_parallel/memory.h"
#include "tutti/comm.h"

namespace tutti {

class MeshImpl;

namespace tp {

// In place over the TP group.
void allreduce(MeshImpl& mesh, const Tensor& t, ReduceOp op,
               const std::string& what, void* stream);
// out [p * r, c] = the inputs [r, c] of TP ranks 0..p-1 stacked on dim 0.
void allgather_rows(MeshImpl& mesh, const Tensor& in, const Tensor& out,
                    const std::string& what, void* stream);
// out [r, c] = block tp_rank of the sum over TP ranks of in [p * r, c].
void reduce_scatter_rows(MeshImpl& mesh, const Tensor& in, const Tensor& out,
                         const std::string& what, void* stream);
// out [r, p * c] = the inputs [r, c] of TP ranks 0..p-1 side by side on the
// last dimension (gathered into a scratch slot of `ws`, then interleaved).
void allgather_cols(MeshImpl& mesh, Workspace& ws, int slot, const Tensor& in,
                    const Tensor& out, const std::string& what, void* stream);
// out [r, c] = columns [part * c, (part + 1) * c) of in [r, p * c].  Local.
void slice_cols(const Tensor& in, const Tensor& out, int part, void* stream);
// out [r, c] = rows [part * r, (part + 1) * r) of in [p * r, c].  Local.
void slice_rows(const Tensor& in, const Tensor& out, int part, void* stream);

// Fail-fast across the TP group, as process-group collectives do: runs
// `body` (one public TP call: a layer pass, a region operator, ...).  When it
// throws an error that did not come out of a TP collective (argument
// validation on this rank, a kernel), this rank first submits to the TP
// group a request that fails the communicator's own validation.  The
// communicator then joins the group's agreement check (TUTTI_CHECK_COLLECTIVES)
// marked invalid, so peers waiting in the collective this rank will never
// reach raise kMismatch at once, naming their op and this rank ("rank 1
// rejected the arguments of this operation"), instead of waiting for
// TUTTI_TIMEOUT.  Then the original error is rethrown.  When every TP rank
// fails the same way, they all submit the invalid request, agree, and each
// raises its own error (on NCCL the communicator is given up, as for any
// invalid collective).  Nothing is sent at tp_size 1.
// `what` names the failed call in the invalid request
// ("ColumnParallelLinear 'fc1' forward").
void announce_local_failure(MeshImpl& mesh, const Device& device,
                            const std::string& what) noexcept;
// Errors thrown by TP collectives on this thread so far.
uint64_t collective_failures() noexcept;

template <class F>
auto fail_fast(MeshImpl& mesh, const Device& device, const std::string& what,
               F&& body) -> decltype(body()) {
  const uint64_t before = collective_failures();
  try {
    return body();
  } catch (...) {
    if (collective_failures() == before)
      announce_local_failure(mesh, device, what);
    throw;
  }
}

}  // namespace tp
}  // namespace tutti
