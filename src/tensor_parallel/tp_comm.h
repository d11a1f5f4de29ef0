// The collectives of tensor parallelism, on a mesh's TP group.
//
// Every TP-group collective that the layers and region operators issue goes
// through these functions, which count the bytes (ProcessMesh::comm_stats)
// and skip communication when tp_size is 1.  Tensors are 2-D [rows, cols]
// views; "rows" is the flattened leading (sequence/batch) dimensions and
// "cols" the last (hidden) dimension.  `what` names the operation in error
// messages ("ColumnParallelLinear 'fc1' backward: input grad").
#pragma once

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

}  // namespace tp
}  // namespace tutti
