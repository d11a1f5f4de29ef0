// Region operators: the conjugate communication pairs of tensor parallelism
// (see include/tutti/tensor_parallel.h).
#include <mutex>

#include "core/check.h"
#include "tensor_parallel/layer_util.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace {

enum class Split { kLast, kFirst };

// `whole` is `part` with dimension `split` multiplied by tp_size; both are
// returned as 2-D views ([rows, last dim] for kLast, [first dim, rest] for
// kFirst).
struct Pair {
  Tensor part;
  Tensor whole;
};

Pair check_pair(const ProcessMesh& mesh, const Tensor& part,
                const Tensor& whole, Split split, const std::string& owner) {
  const int p = mesh.tp_size();
  TUTTI_ARG_CHECK(
      part.dtype() == whole.dtype() && part.device() == whole.device(), owner,
      ": ", part.str(), " and ", whole.str(), " differ in dtype or device");
  TUTTI_ARG_CHECK(part.ndim() >= 1 && part.ndim() == whole.ndim(), owner, ": ",
                  part.str(), " and ", whole.str(),
                  " must have the same number (>= 1) of dimensions");
  const int nd = part.ndim();
  const int d = split == Split::kLast ? nd - 1 : 0;
  const char* which = split == Split::kLast ? "last" : "first";
  tp::check_divisible(
      owner, split == Split::kLast ? "last dimension" : "first dimension",
      whole.shape()[d], p, /*may_be_zero=*/true);
  bool ok = whole.shape()[d] == part.shape()[d] * p;
  for (int i = 0; i < nd; ++i)
    ok = ok && (i == d || whole.shape()[i] == part.shape()[i]);
  TUTTI_ARG_CHECK(ok, owner, ": the shard ", part.str(), " and the full ",
                  whole.str(), " must agree except in the ", which,
                  " dimension, which is tp_size ", p,
                  " times larger in the full tensor");
  // Product of the dimensions other than the split one.
  int64_t other = 1;
  for (int i = 0; i < nd; ++i)
    if (i != d) other *= part.shape()[i];
  if (split == Split::kLast)
    return {part.view(Shape{other, part.shape()[d]}),
            whole.view(Shape{other, whole.shape()[d]})};
  return {part.view(Shape{part.shape()[0], other}),
          whole.view(Shape{whole.shape()[0], other})};
}

void check_same(const Tensor& a, const Tensor& b, const std::string& owner) {
  TUTTI_ARG_CHECK(a.dtype() == b.dtype() && a.device() == b.device() &&
                      a.shape() == b.shape(),
                  owner, ": ", a.str(), " and ", b.str(),
                  " must have the same shape, dtype "
                  "and device");
}

std::string label(const char* op, const RegionOptions& o) {
  return tp::layer_label(op, o.name);
}

}  // namespace

void copy_to_tp_forward(const ProcessMesh& mesh, const Tensor& input,
                        const Tensor& output, const RegionOptions& o) {
  tp::fail_fast(*mesh.impl(), input.device(), label("copy_to_tp forward", o),
                [&] {
                  check_same(input, output, label("copy_to_tp forward", o));
                  tp::copy_tensor(output, input, o.stream);
                });
}

void copy_to_tp_backward(const ProcessMesh& mesh, const Tensor& grad_output,
                         const Tensor& grad_input, const RegionOptions& o) {
  const std::string owner = label("copy_to_tp backward", o);
  tp::fail_fast(*mesh.impl(), grad_output.device(), owner, [&] {
    check_same(grad_output, grad_input, owner);
    tp::copy_tensor(grad_input, grad_output, o.stream);
    tp::allreduce(*mesh.impl(), grad_input, ReduceOp::kSum, owner, o.stream);
  });
}

void reduce_from_tp_forward(const ProcessMesh& mesh, const Tensor& input,
                            const Tensor& output, const RegionOptions& o) {
  const std::string owner = label("reduce_from_tp forward", o);
  tp::fail_fast(*mesh.impl(), input.device(), owner, [&] {
    check_same(input, output, owner);
    tp::copy_tensor(output, input, o.stream);
    tp::allreduce(*mesh.impl(), output, ReduceOp::kSum, owner, o.stream);
  });
}

void reduce_from_tp_backward(const ProcessMesh& mesh, const Tensor& grad_output,
                             const Tensor& grad_input, const RegionOptions& o) {
  tp::fail_fast(*mesh.impl(), grad_output.device(),
                label("reduce_from_tp backward", o), [&] {
                  check_same(grad_output, grad_input,
                             label("reduce_from_tp backward", o));
                  tp::copy_tensor(grad_input, grad_output, o.stream);
                });
}

void gather_from_tp_forward(const ProcessMesh& mesh, const Tensor& input,
                            const Tensor& output, const RegionOptions& o) {
  const std::string owner = label("gather_from_tp forward", o);
  tp::fail_fast(*mesh.impl(), input.device(), owner, [&] {
    Pair v = check_pair(mesh, input, output, Split::kLast, owner);
    MeshImpl& m = *mesh.impl();
    std::lock_guard<std::mutex> lock(m.region_mu);
    tp::allgather_cols(m, m.region_ws, 0, v.part, v.whole, owner, o.stream);
  });
}

void gather_from_tp_backward(const ProcessMesh& mesh, const Tensor& grad_output,
                             const Tensor& grad_input, const RegionOptions& o) {
  tp::fail_fast(*mesh.impl(), grad_output.device(),
                label("gather_from_tp backward", o), [&] {
                  Pair v =
                      check_pair(mesh, grad_input, grad_output, Split::kLast,
                                 label("gather_from_tp backward", o));
                  tp::slice_cols(v.whole, v.part, mesh.tp_rank(), o.stream);
                });
}

void scatter_to_tp_forward(const ProcessMesh& mesh, const Tensor& input,
                           const Tensor& output, const RegionOptions& o) {
  tp::fail_fast(*mesh.impl(), input.device(), label("scatter_to_tp forward", o),
                [&] {
                  Pair v = check_pair(mesh, output, input, Split::kLast,
                                      label("scatter_to_tp forward", o));
                  tp::slice_cols(v.whole, v.part, mesh.tp_rank(), o.stream);
                });
}

void scatter_to_tp_backward(const ProcessMesh& mesh, const Tensor& grad_output,
                            const Tensor& grad_input, const RegionOptions& o) {
  tp::fail_fast(
      *mesh.impl(), grad_output.device(), label("scatter_to_tp backward", o),
      [&] {
        const std::string owner = label("scatter_to_tp backward", o);
        Pair v = check_pair(mesh, grad_output, grad_input, Split::kLast, owner);
        MeshImpl& m = *mesh.impl();
        std::lock_guard<std::mutex> lock(m.region_mu);
        tp::allgather_cols(m, m.region_ws, 0, v.part, v.whole, owner, o.stream);
      });
}

void gather_from_sequence_parallel_forward(const ProcessMesh& mesh,
                                           const Tensor& input,
                                           const Tensor& output,
                                           const RegionOptions& o) {
  const std::string owner = label("gather_from_sequence_parallel forward", o);
  tp::fail_fast(*mesh.impl(), input.device(), owner, [&] {
    Pair v = check_pair(mesh, input, output, Split::kFirst, owner);
    tp::allgather_rows(*mesh.impl(), v.part, v.whole, owner, o.stream);
  });
}

void gather_from_sequence_parallel_backward(const ProcessMesh& mesh,
                                            const Tensor& grad_output,
                                            const Tensor& grad_input,
                                            const RegionOptions& o) {
  const std::string owner = label("gather_from_sequence_parallel backward", o);
  tp::fail_fast(*mesh.impl(), grad_output.device(), owner, [&] {
    Pair v = check_pair(mesh, grad_input, grad_output, Split::kFirst, owner);
    tp::reduce_scatter_rows(*mesh.impl(), v.whole, v.part, owner, o.stream);
  });
}

void reduce_scatter_to_sequence_parallel_forward(const ProcessMesh& mesh,
                                                 const Tensor& input,
                                                 const Tensor& output,
                                                 const RegionOptions& o) {
  const std::string owner =
      label("reduce_scatter_to_sequence_parallel forward", o);
  tp::fail_fast(*mesh.impl(), input.device(), owner, [&] {
    Pair v = check_pair(mesh, output, input, Split::kFirst, owner);
    tp::reduce_scatter_rows(*mesh.impl(), v.whole, v.part, owner, o.stream);
  });
}

void reduce_scatter_to_sequence_parallel_backward(const ProcessMesh& mesh,
                                                  const Tensor& grad_output,
                                                  const Tensor& grad_input,
                                                  const RegionOptions& o) {
  const std::string owner =
      label("reduce_scatter_to_sequence_parallel backward", o);
  tp::fail_fast(*mesh.impl(), grad_output.device(), owner, [&] {
    Pair v = check_pair(mesh, grad_output, grad_input, Split::kFirst, owner);
    tp::allgather_rows(*mesh.impl(), v.part, v.whole, owner, o.stream);
  });
}

void scatter_to_sequence_parallel_forward(const ProcessMesh& mesh,
                                          const Tensor& input,
                                          const Tensor& output,
                                          const RegionOptions& o) {
  tp::fail_fast(*mesh.impl(), input.device(),
                label("scatter_to_sequence_parallel forward", o), [&] {
                  Pair v = check_pair(
                      mesh, output, input, Split::kFirst,
                      label("scatter_to_sequence_parallel forward", o));
                  tp::slice_rows(v.whole, v.part, mesh.tp_rank(), o.stream);
                });
}

void scatter_to_sequence_parallel_backward(const ProcessMesh& mesh,
                                           const Tensor& grad_output,
                                           const Tensor& grad_input,
                                           const RegionOptions& o) {
  const std::string owner = label("scatter_to_sequence_parallel backward", o);
  tp::fail_fast(*mesh.impl(), grad_output.device(), owner, [&] {
    Pair v = check_pair(mesh, grad_output, grad_input, Split::kFirst, owner);
    tp::allgather_rows(*mesh.impl(), v.part, v.whole, owner, o.stream);
  });
}

}  // namespace tutti
