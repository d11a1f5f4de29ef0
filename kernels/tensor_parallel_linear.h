// Launchers of the tensor-parallel linear-layer kernels.  CPU twins:
// src/tensor_parallel/cpu_kernels.h (same arguments, no stream).
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

// out[r, c] += bias[c]; out [rows, cols] (float32/float16/bfloat16).
void launch_bias_add(void* out, const void* bias, DType dtype, int64_t rows,
                     int64_t cols, cudaStream_t stream);
// db[c] += sum_r dy[r, c], summed in float32.
void launch_bias_grad(const void* dy, void* db, DType dtype, int64_t rows,
                      int64_t cols, cudaStream_t stream);
// *out += sum_i x[i]^2 (float64 accumulation; out is device memory).
void launch_sum_squares(const void* x, DType dtype, int64_t n, double* out,
                        cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
