// State shared by ColumnParallelLinear and RowParallelLinear: the mesh, the
// weight and bias shards, and the layer's scratch memory.
#pragma once

#include <memory>
#include <string>

#include "tensor_parallel/memory.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/parameter.h"
#include "tutti/tensor_parallel.h"

namespace tutti {

class LinearCore {
 public:
  // weight_dim: the dimension of W [out, in] split over the TP group (0:
  // column parallel, 1: row parallel); the bias is split with it when
  // weight_dim is 0 and replicated otherwise.  Checks that tp_size divides
  // the split size.
  LinearCore(ProcessMeshPtr mesh, const char* kind, const std::string& name,
             int64_t in, int64_t out, int weight_dim, bool bias, DType dtype,
             Device device, void* stream);

  ProcessMeshPtr mesh;
  MeshImpl& m;
  std::string label;  // "ColumnParallelLinear 'fc1'"
  int64_t in;
  int64_t out;
  DType dtype;
  Device device;
  void* stream;
  tp::Parameter weight;
  std::unique_ptr<tp::Parameter> bias;  // null without bias
  tp::Workspace ws;
};

}  // namespace tutti
