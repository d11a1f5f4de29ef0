// CUDA twins of the 1-bit sign compressor's encoder and fused decoder (CPU
// references: compression::onebit_encode_cpu / onebit_decode_sum_cpu in
// src/compression/onebit.h; same block layout).
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

// One thread block per chunk: scale = mean |x| (float64 block sum), sign
// words by warp ballot, x -= +-scale (x becomes the residual).
void launch_onebit_encode(float* x, int64_t n, int64_t chunk, uint32_t* block,
                          cudaStream_t stream);
// out[i] = dtype((sum over ranks in order of +-scale) / divisor).
void launch_onebit_decode_sum(const uint32_t* blocks, int world, int64_t n,
                              int64_t chunk, float divisor, void* out,
                              DType dtype, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
