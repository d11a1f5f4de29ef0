// CPU twins of the tensor-parallel CUDA kernels (kernels/tensor_parallel_*.cu).
//
// The same arguments as the launchers, minus the stream, and the same
// semantics; tests run both on the same inputs.  Floating tensors are
// float32, float16 or bfloat16 (`dtype`), computed in float32 with float64
// sums; ids and targets are int32 or int64 (`index_dtype`).
#pragma once

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace tp {
namespace cpu {

// out[r, c] += bias[c] for out [rows, cols].
void bias_add(void* out, const void* bias, DType dtype, int64_t rows,
              int64_t cols);
// db[c] += sum_r dy[r, c].
void bias_grad(const void* dy, void* db, DType dtype, int64_t rows,
               int64_t cols);
// sum_i x[i]^2.
double sum_squares(const void* x, DType dtype, int64_t n);

// out[i, :] = weight[ids[i] - vocab_start, :] when that row is one of the
// vocab_local rows held here, else zeros.  out [n, dim].
void embedding_lookup(const void* ids, DType index_dtype, const void* weight,
                      DType dtype, int64_t n, int64_t dim, int64_t vocab_start,
                      int64_t vocab_local, void* out);
// dweight[ids[i] - vocab_start, :] += dy[i, :] for the ids held here, summed
// in float32: float32 dweight directly; float16/bfloat16 through `acc`
// (vocab_local x dim floats, overwritten) and then one rounding per element
// added to dweight (elements whose sum is exactly 0 are left as they were).
// acc may be null for float32.
void embedding_grad(const void* ids, DType index_dtype, const void* dy,
                    DType dtype, int64_t n, int64_t dim, int64_t vocab_start,
                    int64_t vocab_local, void* dweight, float* acc);

// Vocabulary-parallel cross-entropy, logits [n, v_local] holding global
// vocabulary entries [v_start, v_start + v_local).
// max[i] = max_j logits[i, j].
void ce_local_max(const void* logits, DType dtype, int64_t n, int64_t v_local,
                  float* max);
// stats[i] = sum_j exp(logits[i, j] - max[i]); stats[n + i] =
// logits[i, t - v_start] - max[i] when target t is held here (and not
// ignored), else 0.
void ce_local_sums(const void* logits, DType dtype, const void* targets,
                   DType index_dtype, int64_t n, int64_t v_local,
                   int64_t v_start, int64_t ignore_index, const float* max,
                   float* stats);
// From the TP-summed stats: losses[i] = log(stats[i]) - stats[n + i] (0
// for ignored tokens, NaN for targets outside [0, vocab)); mean_count[0] =
// mean loss over the non-ignored tokens (0 if none), mean_count[1] = their
// count.
void ce_finalize(const float* stats, const void* targets, DType index_dtype,
                 int64_t n, int64_t vocab, int64_t ignore_index, float* losses,
                 float* mean_count);
// grad[i, j] = (softmax[i, j] - [j == t - v_start]) * grad_scale / count for
// non-ignored tokens, 0 otherwise.  grad may alias logits.
void ce_backward(const void* logits, DType dtype, const void* targets,
                 DType index_dtype, int64_t n, int64_t v_local, int64_t v_start,
                 int64_t ignore_index, const float* max, const float* stats,
                 const float* mean_count, float grad_scale, void* grad);

}  // namespace cpu
}  // namespace tp
}  // namespace tutti
