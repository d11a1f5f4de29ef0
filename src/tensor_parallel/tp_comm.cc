#include "tensor_parallel/tp_comm.h"

#include "core/check.h"
#include "core/cuda_utils.h"
#include "tensor_parallel/mesh_impl.h"

namespace tutti {
namespace tp {
namespace {

void check_2d(const Tensor& t, const char* role, const std::string& what) {
  TUTTI_CHECK(t.ndim() == 2, what, ": ", role, " ", t.str(), " is not 2-D");
}

OpOptions options(const std::string& what, void* stream) {
  OpOptions o;
  o.name = what;
  o.stream = stream;
  return o;
}

thread_local uint64_t t_collective_failures = 0;

// Runs one TP-group collective, counting its failures (fail_fast).
template <class F>
void collective(F&& f) {
  try {
    f();
  } catch (...) {
    ++t_collective_failures;
    throw;
  }
}

}  // namespace

uint64_t collective_failures() noexcept { return t_collective_failures; }

void announce_local_failure(MeshImpl& mesh, const Device& device,
                            const std::string& what) noexcept {
  if (mesh.tp_size == 1 || !mesh.tp) return;
  // An all-reduce whose output has more elements than its input: every
  // backend rejects it in validation, before touching memory, and still
  // takes part in the agreement check.  The buffer is never read.
  static float never_read[2];
  const Tensor in(never_read, DType::kFloat32, Shape{1}, device);
  const Tensor out(never_read, DType::kFloat32, Shape{2}, device);
  try {
    mesh.tp->allreduce(
        in, out, ReduceOp::kSum,
        options(what + " failed on TP rank " + std::to_string(mesh.tp_rank),
                nullptr));
  } catch (...) {
    // Expected: the request is invalid by construction.  The caller
    // rethrows the error that matters.
  }
}

void allreduce(MeshImpl& mesh, const Tensor& t, ReduceOp op,
               const std::string& what, void* stream) {
  if (mesh.tp_size == 1) return;
  mesh.count(CollectiveKind::kAllreduce, t.nbytes());
  cuda::OptionalDeviceGuard on_device(t.device());  // NCCL orders by events on `stream`
  collective([&] { mesh.tp->allreduce(t, op, options(what, stream)); });
}

void allgather_rows(MeshImpl& mesh, const Tensor& in, const Tensor& out,
                    const std::string& what, void* stream) {
  check_2d(in, "input", what);
  check_2d(out, "output", what);
  TUTTI_CHECK(out.shape()[0] == in.shape()[0] * mesh.tp_size &&
                  out.shape()[1] == in.shape()[1],
              what, ": all-gather of ", in.str(), " into ", out.str());
  if (mesh.tp_size == 1) return copy_tensor(out, in, stream);
  mesh.count(CollectiveKind::kAllgather, out.nbytes());
  cuda::OptionalDeviceGuard on_device(out.device());
  collective([&] { mesh.tp->allgather(in, out, options(what, stream)); });
}

void reduce_scatter_rows(MeshImpl& mesh, const Tensor& in, const Tensor& out,
                         const std::string& what, void* stream) {
  check_2d(in, "input", what);
  check_2d(out, "output", what);
  TUTTI_CHECK(in.shape()[0] == out.shape()[0] * mesh.tp_size &&
                  out.shape()[1] == in.shape()[1],
              what, ": reduce-scatter of ", in.str(), " into ", out.str());
  if (mesh.tp_size == 1) return copy_tensor(out, in, stream);
  mesh.count(CollectiveKind::kReduceScatter, in.nbytes());
  cuda::OptionalDeviceGuard on_device(out.device());
  collective([&] {
    mesh.tp->reduce_scatter(in, out, ReduceOp::kSum, options(what, stream));
  });
}

void allgather_cols(MeshImpl& mesh, Workspace& ws, int slot, const Tensor& in,
                    const Tensor& out, const std::string& what, void* stream) {
  check_2d(in, "input", what);
  check_2d(out, "output", what);
  const int p = mesh.tp_size;
  const int64_t rows = in.shape()[0], cols = in.shape()[1];
  TUTTI_CHECK(out.shape()[0] == rows && out.shape()[1] == cols * p, what,
              ": all-gather of ", in.str(), " into ", out.str());
  if (p == 1) return copy_tensor(out, in, stream);
  // Gathered blocks arrive rank-major ([p, rows, cols]); interleave them
  // into the rows of `out` with one strided copy per rank.
  Tensor blocks = ws.get(slot, in.dtype(), Shape{p * rows, cols}, in.device());
  mesh.count(CollectiveKind::kAllgather, out.nbytes());
  {
    cuda::OptionalDeviceGuard on_device(blocks.device());
    collective([&] { mesh.tp->allgather(in, blocks, options(what, stream)); });
  }
  const size_t es = in.element_size();
  for (int r = 0; r < p; ++r)
    copy_2d(static_cast<char*>(out.data()) + r * cols * es, p * cols * es,
            static_cast<const char*>(blocks.data()) + r * rows * cols * es,
            cols * es, cols * es, rows, in.device(), stream);
}

void slice_cols(const Tensor& in, const Tensor& out, int part, void* stream) {
  TUTTI_CHECK(in.ndim() == 2 && out.ndim() == 2 &&
                  in.shape()[0] == out.shape()[0] && out.shape()[1] > 0 &&
                  in.shape()[1] % out.shape()[1] == 0 &&
                  (part + 1) * out.shape()[1] <= in.shape()[1],
              "slice_cols of ", in.str(), " into ", out.str(), " part ", part);
  const size_t es = in.element_size();
  const int64_t cols = out.shape()[1];
  copy_2d(out.data(), cols * es,
          static_cast<const char*>(in.data()) + part * cols * es,
          in.shape()[1] * es, cols * es, out.shape()[0], in.device(), stream);
}

void slice_rows(const Tensor& in, const Tensor& out, int part, void* stream) {
  TUTTI_CHECK(in.ndim() == 2 && out.ndim() == 2 &&
                  in.shape()[1] == out.shape()[1] &&
                  (part + 1) * out.shape()[0] <= in.shape()[0],
              "slice_rows of ", in.str(), " into ", out.str(), " part ", part);
  const int64_t r = out.shape()[0];
  copy_tensor(out, in.narrow_rows(part * r, (part + 1) * r), stream);
}

}  // namespace tp
}  // namespace tutti
