// Device dispatch of the tensor-parallel elementwise and reduction ops: CUDA
// tensors go to the kernels in kernels/tensor_parallel_*.cu, host tensors to
// their CPU twins (cpu_kernels.h).  Shapes are checked by the callers (the
// layers); these check only what the kernels rely on.
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/tensor.h"

namespace tutti {
namespace tp {

// out2d [rows, cols] += bias [cols] (broadcast over rows).
void bias_add(const Tensor& out2d, const Tensor& bias, void* stream);
// db [cols] += column sums of dy2d [rows, cols].
void bias_grad(const Tensor& dy2d, const Tensor& db, void* stream);
// out[t] = sum of xs[t][i]^2 in float64 for every tensor, deterministic:
// the same bits every run for the same inputs (no atomics; fixed-order
// reductions).  All tensors on one device.  CUDA: one host sync for the
// whole list (the results are copied back together), and no allocation once
// warm: the scratch is kept per (device, stream).
void sum_squares(const std::vector<Tensor>& xs, double* out, void* stream);

// out2d [n, dim] = rows of weight [vocab_local, dim] for ids [n] in
// [vocab_start, vocab_start + vocab_local), zeros for other ids.
void embedding_lookup(const Tensor& ids, const Tensor& weight,
                      int64_t vocab_start, const Tensor& out2d, void* stream);
// dweight [vocab_local, dim] rows += dy2d [n, dim] rows of the ids held,
// summed in float32 (see cpu_kernels.h).  acc32: float32 scratch of
// dweight's shape on its device, needed when dweight is float16/bfloat16
// (an empty Tensor will do for float32); its contents are overwritten.
void embedding_grad(const Tensor& ids, const Tensor& dy2d, int64_t vocab_start,
                    const Tensor& dweight, const Tensor& acc32, void* stream);

// Cross-entropy pieces (see cpu_kernels.h); logits2d [n, v_local], targets
// [n], max [n], stats [2n], losses [n], mean_count [2], all float32 except
// logits (and grad) and targets.
void ce_local_max(const Tensor& logits2d, const Tensor& max, void* stream);
void ce_local_sums(const Tensor& logits2d, const Tensor& targets,
                   int64_t v_start, int64_t ignore_index, const Tensor& max,
                   const Tensor& stats, void* stream);
void ce_finalize(const Tensor& stats, const Tensor& targets, int64_t vocab,
                 int64_t ignore_index, const Tensor& losses,
                 const Tensor& mean_count, void* stream);
void ce_backward(const Tensor& logits2d, const Tensor& targets, int64_t v_start,
                 int64_t ignore_index, const Tensor& max, const Tensor& stats,
                 const Tensor& mean_count, float grad_scale,
                 const Tensor& grad2d, void* stream);

}  // namespace tp
}  // namespace tutti
