// The host twins of the multi-tensor kernels in kernels/amp_*.cu: the same
// arithmetic (float32, one rounding into the destination), vectorised with
// AVX2/F16C when the CPU has it and scalar otherwise.  Results are
// bit-identical between the vector and the scalar path, and to the CUDA
// kernels for scale_copy except for NaN payloads (CUDA's conversions write
// a canonical NaN); norms agree to float32 accumulation error.
#pragma once

#include <cstdint>

#include "tutti/dtype.h"

namespace tutti {
namespace amp {

// dst[i] = round_dst(float(src[i]) * scale) for i < n; true when a written
// value is non-finite.  With src == dst, equal dtypes and scale == 1 the
// memory is only read (and checked).  dtypes: float32, float16, bfloat16.
bool cpu_scale_copy(const void* src, DType src_dtype, void* dst,
                    DType dst_dtype, int64_t n, float scale);

struct CpuNorm {
  double sum_squares = 0;  // of x * prescale
  float max_abs = 0;       // of x * prescale; NaN if any element is NaN
};

// Sum of squares (float32 within blocks of 2048 elements, float64 across
// blocks) and largest magnitude of x[i] * prescale.
CpuNorm cpu_norm(const void* x, DType dtype, int64_t n, float prescale);

}  // namespace amp
}  // namespace tutti
