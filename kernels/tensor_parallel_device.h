// Device-side helpers shared by the tensor-parallel kernels (included by
// kernels/tensor_parallel_*.cu only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "tutti/dtype.h"

namespace tutti {
namespace kernels {
namespace tpdev {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename I>
__device__ __forceinline__ int64_t index_at(const void* p, int64_t i) {
  return static_cast<int64_t>(static_cast<const I*>(p)[i]);
}

constexpr int kBlock = 256;

// Sum / max over the block (blockDim.x a multiple of 32, at most 1024).
// Every thread gets the result.
template <typename V>
__device__ V block_sum(V v) {
  __shared__ V part[32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  V r = 0;
  for (int w = 0; w < warps; ++w) r += part[w];
  return r;
}

__device__ inline float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float r = part[0];
  for (int w = 1; w < warps; ++w) r = fmaxf(r, part[w]);
  return r;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 1 ? 1
                                          : (blocks > 8192 ? 8192 : blocks));
}

// Calls f(T{}) with T the device type of a floating dtype.
template <typename F>
void dispatch_float(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kFloat16:
      f(__half{});
      return;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    default:
      TUTTI_THROW(kUnsupported, what, " on ", dtype_name(dtype),
                  " (float32, float16 or bfloat16)");
  }
}

// Calls f(I{}) with I the C++ type of an index dtype.
template <typename F>
void dispatch_index(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kInt32:
      f(int32_t{});
      return;
    case DType::kInt64:
      f(int64_t{});
      return;
    default:
      TUTTI_THROW(kInvalidArgument, what,
                  ": ids/targets must be int32 or int64, got ",
                  dtype_name(dtype));
  }
}

// The argument checks every launcher makes.
inline void check_launch_args(const char* what, int64_t n, bool pointers_ok) {
  TUTTI_ARG_CHECK(n >= 0, what, ": negative size ", n);
  TUTTI_ARG_CHECK(n == 0 || pointers_ok, what, ": null pointer for ", n,
                  " elements");
}

}  // namespace tpdev
}  // namespace kernels
}  // namespace tutti
