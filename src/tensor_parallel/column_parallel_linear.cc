// ColumnParallelLinear: W [out, in] split by output features.
//
//   forward   X  --copy_to_tp / SP all-gather-->  X W_r^T + b_r
//   --(gather_output)-->  Y backward  dW_r += dY_r^T X,  db_r += colsum(dY_r),
//             dX = sum over TP of dY_r W_r  (all-reduce, or SP reduce-scatter)
#include "core/check.h"
#include "core/gemm.h"
#include "tensor_parallel/layer_util.h"
#include "tensor_parallel/linear_core.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_comm.h"

namespace tutti {
namespace {

// Scratch slots of this layer's workspace.
enum Slot {
  kGatheredInput,
  kLocalOutput,
  kLocalGradOutput,
  kFullGradInput,
  kGatherBlocks
};

std::unique_ptr<LinearCore> make_core(ProcessMeshPtr mesh, int64_t in,
                                      int64_t out,
                                      const ColumnParallelLinearOptions& o) {
  const std::string label = tp::layer_label("ColumnParallelLinear", o.name);
  TUTTI_ARG_CHECK(
      !(o.sequence_parallel && o.gather_output), label,
      ": sequence_parallel needs gather_output = false (the output stays split "
      "on the hidden dimension for a RowParallelLinear)");
  return std::make_unique<LinearCore>(
      std::move(mesh), "ColumnParallelLinear", o.name, in, out,
      /*weight_dim=*/0, o.bias, o.dtype, o.device, o.stream);
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(
    ProcessMeshPtr mesh, int64_t in_features, int64_t out_features,
    const ColumnParallelLinearOptions& options)
    : TensorParallelLinear(
          make_core(std::move(mesh), in_features, out_features, options)),
      options_(options) {}

int64_t ColumnParallelLinear::out_features_per_rank() const {
  return core_->out / core_->m.tp_size;
}

namespace {

// What forward and backward both derive from the input: its 2-D view, the
// full row count (all TP ranks' rows under sequence parallelism) and which
// collectives apply.
struct Pass {
  std::string what;
  bool sp, gather;
  int64_t out_local, rows;
  Tensor x_in;
};

// `what`: the layer's label and pass ("... 'fc1' forward"), built once by
// the caller for fail_fast() too.
Pass make_pass(LinearCore& c, const ColumnParallelLinearOptions& o,
               const Tensor& input, const std::string& what) {
  Pass s;
  const int p = c.m.tp_size;
  s.what = what;
  s.sp = o.sequence_parallel && p > 1;
  s.gather = o.gather_output && p > 1;
  s.out_local = c.out / p;
  s.x_in = tp::view_2d(input, c.in, -1, c.dtype, c.device, s.what, "input");
  s.rows = s.sp ? s.x_in.shape()[0] * p : s.x_in.shape()[0];
  return s;
}

// The GEMM input: the input itself, or (sequence parallel) all TP ranks'
// rows gathered into scratch.  Backward gathers again rather than keeping
// forward's copy alive in between (activation memory).
Tensor full_input(LinearCore& c, const Pass& s) {
  if (!s.sp) return s.x_in;
  Tensor x = c.ws.get(kGatheredInput, c.dtype, Shape{s.rows, c.in}, c.device);
  tp::allgather_rows(c.m, s.x_in, x, s.what + ": sequence-parallel input",
                     c.stream);
  return x;
}

}  // namespace

void ColumnParallelLinear::forward(const Tensor& input, const Tensor& output) {
  const std::string what = core_->label + " forward";
  return tp::fail_fast(core_->m, core_->device, what, [&] {
    LinearCore& c = *core_;
    const Pass s = make_pass(c, options_, input, what);
    Tensor y = tp::view_2d(output, s.gather ? c.out : s.out_local, s.rows,
                           c.dtype, c.device, s.what, "output");
    Tensor x = full_input(c, s);
    Tensor y_local = s.gather ? c.ws.get(kLocalOutput, c.dtype,
                                         Shape{s.rows, s.out_local}, c.device)
                              : y;
    blas::gemm(x, false, c.weight.value(), true, y_local, 1.0f, 0.0f, c.stream);
    if (c.bias) tp::bias_add(y_local, c.bias->value(), c.stream);
    if (s.gather)
      tp::allgather_cols(c.m, c.ws, kGatherBlocks, y_local, y,
                         s.what + ": output", c.stream);
  });
}

void ColumnParallelLinear::backward(const Tensor& input,
                                    const Tensor& grad_output,
                                    const Tensor& grad_input) {
  const std::string what = core_->label + " backward";
  return tp::fail_fast(
      core_->m, core_->device, what, [&] {
        LinearCore& c = *core_;
        const Pass s = make_pass(c, options_, input, what);
        Tensor dy =
            tp::view_2d(grad_output, s.gather ? c.out : s.out_local, s.rows,
                        c.dtype, c.device, s.what, "grad_output");
        const bool want_dx = !tp::is_absent(grad_input);
        Tensor dx = want_dx
                        ? tp::view_2d(grad_input, c.in, s.x_in.shape()[0],
                                      c.dtype, c.device, s.what, "grad_input")
                        : Tensor();
        Tensor x = full_input(c, s);
        Tensor dy_local = dy;
        if (s.gather) {
          dy_local = c.ws.get(kLocalGradOutput, c.dtype,
                              Shape{s.rows, s.out_local}, c.device);
          tp::slice_cols(dy, dy_local, c.m.tp_rank, c.stream);
        }
        blas::gemm(dy_local, true, x, false, c.weight.grad(), 1.0f, 1.0f,
                   c.stream);
        if (c.bias) tp::bias_grad(dy_local, c.bias->grad(), c.stream);
        if (!want_dx) return;
        if (s.sp) {
          Tensor full =
              c.ws.get(kFullGradInput, c.dtype, Shape{s.rows, c.in}, c.device);
          blas::gemm(dy_local, false, c.weight.value(), false, full, 1.0f, 0.0f,
                     c.stream);
          tp::reduce_scatter_rows(c.m, full, dx, s.what + ": input grad",
                                  c.stream);
          return;
        }
        blas::gemm(dy_local, false, c.weight.value(), false, dx, 1.0f, 0.0f,
                   c.stream);
        tp::allreduce(c.m, dx, ReduceOp::kSum, s.what + ": input grad",
                      c.stream);
      });
}

}  // namespace tutti
