// Kernels of kernels/data_parallel.h, then one launcher per kernel.
#include "kernels/data_parallel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/cuda_utils.h"

namespace tutti {
namespace kernels {
namespace {

// Element conversions to the arithmetic type and back: integers divide in
// int64, 16-bit floats in float32 (rounded to nearest even once).
template <typename T>
struct Arith {
  using type = typename std::conditional<std::is_integral<T>::value, int64_t, T>::type;
  __device__ static type load(T v) { return static_cast<type>(v); }
  __device__ static T store(type v) { return static_cast<T>(v); }
};
template <>
struct Arith<__half> {
  using type = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Arith<__nv_bfloat16> {
  using type = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

// One block per chunk; threads stride over the chunk's elements.
template <typename T>
__global__ void unflatten_scale_kernel(const T* __restrict__ flat,
                                       const UnflattenChunk* __restrict__ chunks,
                                       int64_t divisor) {
  const UnflattenChunk c = chunks[blockIdx.x];
  const T* src = flat + c.src_offset;
  T* dst = static_cast<T*>(c.dst);
  using A = typename Arith<T>::type;
  const A d = static_cast<A>(divisor);
  for (int64_t i = threadIdx.x; i < c.numel; i += blockDim.x) {
    if (divisor == 1)
      dst[i] = src[i];
    else
      dst[i] = Arith<T>::store(Arith<T>::load(src[i]) / d);
  }
}

template <typename T>
void launch_typed(const void* flat, const UnflattenChunk* chunks,
                  int num_chunks, int64_t divisor, cudaStream_t stream) {
  constexpr int kThreads = 256;
  unflatten_scale_kernel<T><<<num_chunks, kThreads, 0, stream>>>(
      static_cast<const T*>(flat), chunks, divisor);
}

}  // namespace

void launch_unflatten_scale(const void* flat, DType dtype,
                            const UnflattenChunk* chunks, int num_chunks,
                            int64_t divisor, cudaStream_t stream) {
  TUTTI_ARG_CHECK(divisor >= 1, "unflatten_scale: divisor ", divisor,
                  " must be >= 1");
  TUTTI_ARG_CHECK(num_chunks >= 0, "unflatten_scale: num_chunks ", num_chunks);
  if (num_chunks == 0) return;
  TUTTI_ARG_CHECK(flat && chunks, "unflatten_scale: null bucket or chunk table");
  switch (dtype) {
    case DType::kFloat32: launch_typed<float>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kFloat64: launch_typed<double>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kFloat16: launch_typed<__half>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kBFloat16: launch_typed<__nv_bfloat16>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kInt8: launch_typed<int8_t>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kUInt8: launch_typed<uint8_t>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kInt32: launch_typed<int32_t>(flat, chunks, num_chunks, divisor, stream); break;
    case DType::kInt64: launch_typed<int64_t>(flat, chunks, num_chunks, divisor, stream); break;
  }
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
