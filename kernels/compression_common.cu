// Float32 staging kernels for the compressors (CPU reference:
// src/compression/common.cc, namespace compression::cpu).
#include "kernels/compression_common.h"

#include "kernels/compression_device.cuh"

namespace tutti {
namespace kernels {
namespace {

template <typename T>
__global__ void accumulate_f32_kernel(const T* src, float* acc, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    acc[i] = acc[i] + dev::to_f32(src[i]);
}

template <typename T>
__global__ void load_f32_kernel(const T* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = dev::to_f32(src[i]);
}

template <typename T>
__global__ void store_f32_kernel(const float* src, float divisor, T* dst,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = dev::from_f32<T>(__fdiv_rn(src[i], divisor));
}

__device__ __forceinline__ bool finite_f(float x) { return isfinite(x); }
__device__ __forceinline__ bool finite_f(double x) { return isfinite(x); }
__device__ __forceinline__ bool finite_f(__half x) {
  return (__half_as_ushort(x) & 0x7c00u) != 0x7c00u;
}
__device__ __forceinline__ bool finite_f(__nv_bfloat16 x) {
  return (__bfloat16_as_ushort(x) & 0x7f80u) != 0x7f80u;
}

// The flag is only ever raised (0 -> 1), so racing writers agree; one write
// per block that saw a non-finite value.
template <typename T>
__global__ void nonfinite_flag_kernel(const T* src, int64_t n, int32_t* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !finite_f(src[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

void check_args(const void* a, const void* b, int64_t n, const char* what) {
  TUTTI_ARG_CHECK(n >= 0, what, ": negative element count ", n);
  TUTTI_ARG_CHECK(n == 0 || (a && b), what, ": null pointer for ", n,
                  " elements");
}

}  // namespace

void launch_accumulate_f32(const void* src, DType dtype, float* acc, int64_t n,
                           cudaStream_t stream) {
  check_args(src, acc, n, "accumulate_f32");
  if (n == 0) return;
  dev::dispatch_float(dtype, "accumulate_f32", [&](auto t) {
    using T = decltype(t);
    accumulate_f32_kernel<T><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
        static_cast<const T*>(src), acc, n);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_load_f32(const void* src, DType dtype, float* dst, int64_t n,
                     cudaStream_t stream) {
  check_args(src, dst, n, "load_f32");
  if (n == 0) return;
  dev::dispatch_float(dtype, "load_f32", [&](auto t) {
    using T = decltype(t);
    load_f32_kernel<T><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
        static_cast<const T*>(src), dst, n);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_store_f32(const float* src, float divisor, void* dst, DType dtype,
                      int64_t n, cudaStream_t stream) {
  check_args(src, dst, n, "store_f32");
  TUTTI_ARG_CHECK(divisor > 0, "store_f32: divisor ", divisor, " must be > 0");
  if (n == 0) return;
  dev::dispatch_float(dtype, "store_f32", [&](auto t) {
    using T = decltype(t);
    store_f32_kernel<T><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
        src, divisor, static_cast<T*>(dst), n);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_nonfinite_flag(const void* src, DType dtype, int64_t n,
                           int32_t* flag, cudaStream_t stream) {
  check_args(src, flag, n, "nonfinite_flag");
  TUTTI_ARG_CHECK(flag != nullptr, "nonfinite_flag: null flag");
  TUTTI_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), stream));
  if (n == 0) return;
  dev::dispatch_float(dtype, "nonfinite_flag", [&](auto t) {
    using T = decltype(t);
    nonfinite_flag_kernel<T><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
        static_cast<const T*>(src), n, flag);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
