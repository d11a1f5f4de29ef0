// CUDA twins of PowerSGD's orthonormalisation and decompression (CPU
// references: compression::powersgd_orthogonalize_cpu and
// powersgd_decompress_cpu in src/compression/powersgd.h).  The two GEMMs
// (P = M Q, Q = M^T P) go through cuBLAS (core/gemm.h).
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

// Modified Gram-Schmidt on the r columns of the row-major m x r matrix p, in
// one thread block (float64 block sums in a fixed order); zero columns are
// re-seeded from hash_uniform(seed, stream, row * r + col).
void launch_powersgd_orthogonalize(float* p, int64_t m, int64_t r,
                                   uint64_t seed, uint64_t stream_id,
                                   cudaStream_t stream);
// out = P Q^T (sums over r ascending, no fused multiply-add), residual -=
// out, grad = dtype(out); P m x r, Q n x r, residual and grad m x n.
void launch_powersgd_decompress(const float* p, const float* q, int64_t m,
                                int64_t n, int64_t r, float* residual,
                                void* grad, DType dtype, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
