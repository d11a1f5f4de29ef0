// Device helpers shared by the amp kernels: element types by MtaDType, the
// float32 widening, rounding stores that return the stored value's
// magnitude bits (NaN/Inf iff they reach inf_bits), and vector packs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/amp_multi_tensor.h"

namespace tutti {
namespace amp {
namespace dev {

template <int T>
struct Elem;
template <>
struct Elem<kMtaF32> {
  using type = float;
  static constexpr uint32_t kInfBits = 0x7f800000u;
};
template <>
struct Elem<kMtaF16> {
  using type = __half;
  static constexpr uint32_t kInfBits = 0x7c00u;
};
template <>
struct Elem<kMtaBF16> {
  using type = __nv_bfloat16;
  static constexpr uint32_t kInfBits = 0x7f80u;
};

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ uint32_t magnitude(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}
__device__ __forceinline__ uint32_t magnitude(__half v) {
  return __half_as_ushort(v) & 0x7fffu;
}
__device__ __forceinline__ uint32_t magnitude(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v) & 0x7fffu;
}

// Rounds v into *out (round to nearest even, NaN kept, overflow to Inf) and
// returns the magnitude bits of what was stored.
__device__ __forceinline__ uint32_t round_store(float v, float* out) {
  *out = v;
  return magnitude(v);
}
__device__ __forceinline__ uint32_t round_store(float v, __half* out) {
  *out = __float2half_rn(v);
  return magnitude(*out);
}
__device__ __forceinline__ uint32_t round_store(float v, __nv_bfloat16* out) {
  *out = __float2bfloat16_rn(v);
  return magnitude(*out);
}

// N elements loaded or stored with one aligned access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ bool aligned_for(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, N>) == 0;
}

// Calls f(element) for this thread's share of p[0, n): aligned 4-element
// vector loads when p allows, element loads for the rest.
template <typename T, typename F>
__device__ __forceinline__ void for_each_loaded(const T* p, int64_t n, F f) {
  constexpr int kVec = 4;
  int64_t tail = 0;
  if (aligned_for<T, kVec>(p)) {
    const int64_t packs = n / kVec;
    const auto* in = reinterpret_cast<const Pack<T, kVec>*>(p);
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const Pack<T, kVec> a = in[q];
#pragma unroll
      for (int k = 0; k < kVec; ++k) f(a.v[k]);
    }
    tail = packs * kVec;
  }
  for (int64_t i = tail + threadIdx.x; i < n; i += blockDim.x) f(p[i]);
}

}  // namespace dev
}  // namespace amp
}  // namespace tutti
