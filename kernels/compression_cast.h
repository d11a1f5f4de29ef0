// CUDA twin of the fp16/bf16 cast compressor's conversion
// (CPU reference: compression::cast_convert_cpu in src/compression/cast.h).
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace kernels {

// dst[i] = dst_dtype(float(src[i]) / divisor), one rounding to nearest even.
// Both dtypes floating; src == dst allowed when the element sizes match.
void launch_cast_convert(const void* src, DType src_dtype, void* dst,
                         DType dst_dtype, int64_t n, float divisor,
                         cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
