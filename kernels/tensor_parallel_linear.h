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
// Deterministic sum of squares in two launches, no atomics: the same bits
// every run for the same inputs (the grid depends only on n, each thread and
// each block sums in a fixed order).
// Stage 1: partials[b] = sum of x[i]^2 over block b's grid-stride share
// (float64), for b < *blocks, and *blocks := the grid size (<=
// kSumSquaresMaxPartials).  partials holds kSumSquaresMaxPartials doubles.
constexpr int kSumSquaresMaxPartials = 1024;
void launch_sum_squares_partials(const void* x, DType dtype, int64_t n,
                                 double* partials, int32_t* blocks,
                                 cudaStream_t stream);
// Stage 2, for `count` tensors at once: out[t] = the sum, in block order, of
// partials[t * kSumSquaresMaxPartials + b] for b < blocks[t].
void launch_sum_squares_finish(const double* partials, const int32_t* blocks,
                               int64_t count, double* out,
                               cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
