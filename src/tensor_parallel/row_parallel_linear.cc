// RowParallelLinear: W [out, in] split by input features; b replicated.
//
//   forward   X_r (input_is_parallel, or this rank's slice of X)
//             Y = sum over TP of X_r W_r^T (all-reduce, or SP reduce-scatter) +
//             b
//   backward  dY (SP: all-gathered),  dW_r += dY^T X_r,  db += colsum(dY),
//             dX_r = dY W_r  (all-gathered on the last dimension unless
//             input_is_parallel)
#include "core/check.h"
#include "core/gemm.h"
#include "tensor_parallel/layer_util.h"
#include "tensor_parallel/linear_core.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_comm.h"

namespace tutti {
namespace {

enum Slot {
  kSlicedInput,
  kPartialOutput,
  kGatheredGradOutput,
  kLocalGradInput,
  kGatherBlocks
};

std::unique_ptr<LinearCore> make_core(ProcessMeshPtr mesh, int64_t in,
                                      int64_t out,
                                      const RowParallelLinearOptions& o) {
  const std::string label = tp::layer_label("RowParallelLinear", o.name);
  TUTTI_ARG_CHECK(!(o.sequence_parallel && !o.input_is_parallel), label,
                  ": sequence_parallel needs input_is_parallel = true");
  return std::make_unique<LinearCore>(
      std::move(mesh), "RowParallelLinear", o.name, in, out,
      /*weight_dim=*/1, o.bias, o.dtype, o.device, o.stream);
}

}  // namespace

RowParallelLinear::RowParallelLinear(ProcessMeshPtr mesh, int64_t in_features,
                                     int64_t out_features,
                                     const RowParallelLinearOptions& options)
    : TensorParallelLinear(
          make_core(std::move(mesh), in_features, out_features, options)),
      options_(options) {}

int64_t RowParallelLinear::in_features_per_rank() const {
  return core_->in / core_->m.tp_size;
}

namespace {

// What forward and backward both derive from the input.
struct Pass {
  std::string what;
  bool sp;
  int64_t in_cols, rows;
  Tensor x_in;
};

// The first dimension of an activation whose leading dimensions are
// [sequence, ...] (a 1-D activation is one row).
int64_t sequence_length(const Tensor& t) {
  return t.ndim() > 1 ? t.shape()[0] : 1;
}

// `what`: the layer's label and pass ("... 'fc1' forward"), built once by
// the caller for fail_fast() too.
Pass make_pass(LinearCore& c, const RowParallelLinearOptions& o,
               const Tensor& input, const std::string& what) {
  Pass s;
  const int p = c.m.tp_size;
  s.what = what;
  s.sp = o.sequence_parallel && p > 1;
  s.in_cols = o.input_is_parallel ? c.in / p : c.in;
  s.x_in =
      tp::view_2d(input, s.in_cols, -1, c.dtype, c.device, s.what, "input");
  s.rows = s.x_in.shape()[0];
  if (s.sp)
    tp::check_divisible(s.what, "sequence length (input's first dimension)",
                        sequence_length(input), p, /*may_be_zero=*/true);
  return s;
}

// This rank's input columns: the input itself when it is already split, else
// a slice of it in scratch.
Tensor local_input(LinearCore& c, const Tensor& x_in, bool input_is_parallel) {
  if (input_is_parallel || c.m.tp_size == 1) return x_in;
  Tensor x = c.ws.get(kSlicedInput, c.dtype,
                      Shape{x_in.shape()[0], c.in / c.m.tp_size}, c.device);
  tp::slice_cols(x_in, x, c.m.tp_rank, c.stream);
  return x;
}

}  // namespace

void RowParallelLinear::forward(const Tensor& input, const Tensor& output) {
  const std::string what = core_->label + " forward";
  return tp::fail_fast(core_->m, core_->device, what, [&] {
    LinearCore& c = *core_;
    const Pass s = make_pass(c, options_, input, what);
    const int p = c.m.tp_size;
    Tensor y = tp::view_2d(output, c.out, s.sp ? s.rows / p : s.rows, c.dtype,
                           c.device, s.what, "output");
    Tensor x = local_input(c, s.x_in, options_.input_is_parallel);
    if (s.sp) {
      Tensor partial =
          c.ws.get(kPartialOutput, c.dtype, Shape{s.rows, c.out}, c.device);
      blas::gemm(x, false, c.weight.value(), true, partial, 1.0f, 0.0f,
                 c.stream);
      tp::reduce_scatter_rows(c.m, partial, y, s.what + ": output", c.stream);
    } else {
      blas::gemm(x, false, c.weight.value(), true, y, 1.0f, 0.0f, c.stream);
      tp::allreduce(c.m, y, ReduceOp::kSum, s.what + ": output", c.stream);
    }
    if (c.bias) tp::bias_add(y, c.bias->value(), c.stream);
  });
}

void RowParallelLinear::backward(const Tensor& input, const Tensor& grad_output,
                                 const Tensor& grad_input) {
  const std::string what = core_->label + " backward";
  return tp::fail_fast(
      core_->m, core_->device, what, [&] {
        LinearCore& c = *core_;
        const Pass s = make_pass(c, options_, input, what);
        const int p = c.m.tp_size;
        Tensor dy = tp::view_2d(grad_output, c.out, s.sp ? s.rows / p : s.rows,
                                c.dtype, c.device, s.what, "grad_output");
        const bool want_dx = !tp::is_absent(grad_input);
        Tensor dx = want_dx
                        ? tp::view_2d(grad_input, s.in_cols, s.rows, c.dtype,
                                      c.device, s.what, "grad_input")
                        : Tensor();
        if (s.sp) {
          Tensor full = c.ws.get(kGatheredGradOutput, c.dtype,
                                 Shape{s.rows, c.out}, c.device);
          tp::allgather_rows(c.m, dy, full,
                             s.what + ": sequence-parallel grad_output",
                             c.stream);
          dy = full;
        }
        Tensor x = local_input(c, s.x_in, options_.input_is_parallel);
        blas::gemm(dy, true, x, false, c.weight.grad(), 1.0f, 1.0f, c.stream);
        if (c.bias) tp::bias_grad(dy, c.bias->grad(), c.stream);
        if (!want_dx) return;
        if (options_.input_is_parallel || p == 1) {
          blas::gemm(dy, false, c.weight.value(), false, dx, 1.0f, 0.0f,
                     c.stream);
          return;
        }
        Tensor dx_local = c.ws.get(kLocalGradInput, c.dtype,
                                   Shape{s.rows, c.in / p}, c.device);
        blas::gemm(dy, false, c.weight.value(), false, dx_local, 1.0f, 0.0f,
                   c.stream);
        tp::allgather_cols(c.m, c.ws, kGatherBlocks, dx_local, dx,
                           s.what + ": input grad", c.stream);
      });
}

}  // namespace tutti
