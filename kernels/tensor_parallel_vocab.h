// Launchers of the vocabulary-parallel embedding and cross-entropy kernels.
// CPU twins: src/tensor_parallel/cpu_kernels.h (same arguments and
// semantics, no stream).  Floating tensors are float32/float16/bfloat16
// (`dtype`), ids and targets int32/int64 (`index_dtype`).
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

void launch_embedding_lookup(const void* ids, DType index_dtype,
                             const void* weight, DType dtype, int64_t n,
                             int64_t dim, int64_t vocab_start,
                             int64_t vocab_local, void* out,
                             cudaStream_t stream);
// dweight[ids[i] - vocab_start, :] += dy[i, :] for the ids held here, summed
// in float32: float32 atomics straight into a float32 dweight; for
// float16/bfloat16 a float32 scatter-add into `acc` (vocab_local x dim
// floats, zeroed here) and one rounding per element when it is added to
// dweight.  A frequent token's gradient in half-precision atomics would
// stall once the sum outgrows the addend (2048 + 1 == 2048 in float16).
// acc may be null for float32.
void launch_embedding_grad(const void* ids, DType index_dtype, const void* dy,
                           DType dtype, int64_t n, int64_t dim,
                           int64_t vocab_start, int64_t vocab_local,
                           void* dweight, float* acc, cudaStream_t stream);
void launch_ce_local_max(const void* logits, DType dtype, int64_t n,
                         int64_t v_local, float* max, cudaStream_t stream);
void launch_ce_local_sums(const void* logits, DType dtype, const void* targets,
                          DType index_dtype, int64_t n, int64_t v_local,
                          int64_t v_start, int64_t ignore_index,
                          const float* max, float* stats, cudaStream_t stream);
void launch_ce_finalize(const float* stats, const void* targets,
                        DType index_dtype, int64_t n, int64_t vocab,
                        int64_t ignore_index, float* losses, float* mean_count,
                        cudaStream_t stream);
void launch_ce_backward(const void* logits, DType dtype, const void* targets,
                        DType index_dtype, int64_t n, int64_t v_local,
                        int64_t v_start, int64_t ignore_index, const float* max,
                        const float* stats, const float* mean_count,
                        float grad_scale, void* grad, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
