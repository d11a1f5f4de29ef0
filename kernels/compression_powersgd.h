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
// One compressed slot's P for the batched launch (device memory).
struct PowerSgdOrthoSlot {
  int64_t p_off;       // of its m x r P in p_all
  int64_t m, r;
  uint64_t stream_id;  // hash stream for re-seeding
};
// The same orthonormalisation for `count` slots in one launch, a block per
// slot (the slots are independent; each block runs exactly the arithmetic
// of launch_powersgd_orthogonalize, so results are bit-identical to it).
void launch_powersgd_orthogonalize_slots(float* p_all,
                                         const PowerSgdOrthoSlot* slots,
                                         int64_t count, uint64_t seed,
                                         cudaStream_t stream);
// out = P Q^T (sums over r ascending, no fused multiply-add), residual -=
// out, grad = dtype(out); P m x r, Q n x r, residual and grad m x n.
void launch_powersgd_decompress(const float* p, const float* q, int64_t m,
                                int64_t n, int64_t r, float* residual,
                                void* grad, DType dtype, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
