// CUDA twins of the float32 staging ops in src/compression/common.h.  Each
// launcher checks its arguments, launches on `stream` and checks
// cudaGetLastError().  CPU references: compression::cpu::*.
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

// acc[i] += float(src[i]); src of a floating dtype.
void launch_accumulate_f32(const void* src, DType dtype, float* acc, int64_t n,
                           cudaStream_t stream);
// dst[i] = float(src[i]).
void launch_load_f32(const void* src, DType dtype, float* dst, int64_t n,
                     cudaStream_t stream);
// dst[i] = dtype(src[i] / divisor), rounded once (nearest even).
void launch_store_f32(const float* src, float divisor, void* dst, DType dtype,
                      int64_t n, cudaStream_t stream);
// *flag := 1 if some src[i] is Inf or NaN, else 0 (int32 in device memory;
// the launcher zeroes it first).  src of a floating dtype (float64 too).
// No host sync: the flag stays on the device for the cross-rank agreement.
void launch_nonfinite_flag(const void* src, DType dtype, int64_t n,
                           int32_t* flag, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
