// Device-side helpers shared by the compression kernels (included only from
// kernels/compression_*.cu): element conversions, launch geometry, dtype
// dispatch and deterministic block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "tutti/dtype.h"

namespace tutti {
namespace kernels {
namespace dev {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ double from_f32<double>(float x) { return static_cast<double>(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Calls f(T{}) with T the device type of a floating dtype.
template <typename F>
void dispatch_float(DType dtype, const char* what, F f) {
  switch (dtype) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kFloat16: return f(__half{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
    default:
      TUTTI_THROW(kInvalidArgument, what, ": needs a floating-point dtype, got ",
                  dtype_name(dtype));
  }
}

// Sum over the block in a fixed order (warp shuffles, then warp 0): the same
// result every run for the same inputs.  All threads must call it; the
// result is valid on every thread.  blockDim.x must be a multiple of 32 and
// at most 1024.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    T w = lane < nwarps ? warp_sums[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
    if (lane == 0) total = w;
  }
  __syncthreads();
  const T r = total;
  __syncthreads();  // warp_sums/total may be reused by the next call
  return r;
}

// Exclusive prefix sum over the block (thread order) of one int64 per
// thread; *block_total receives the sum.  Same constraints as block_sum.
__device__ inline int64_t block_exclusive_scan(int64_t v, int64_t* block_total) {
  __shared__ int64_t warp_tot[32];
  __shared__ int64_t total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    int64_t t = lane < nwarps ? warp_tot[lane] : 0;
    int64_t ti = t;
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, ti, o);
      if (lane >= o) ti += y;
    }
    if (lane < nwarps) warp_tot[lane] = ti - t;  // exclusive per warp
    if (lane == nwarps - 1) total = ti;
  }
  __syncthreads();
  const int64_t res = warp_tot[warp] + incl - v;
  *block_total = total;
  __syncthreads();
  return res;
}

}  // namespace dev

}  // namespace kernels
}  // namespace tutti
