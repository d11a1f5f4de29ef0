// Counter-based pseudo-random numbers shared by host and device code
// (splitmix64 finaliser): the same values on every rank, CPU and GPU, with
// no generator state to checkpoint.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TUTTI_HD __host__ __device__ __forceinline__
#else
#define TUTTI_HD inline
#endif

namespace tutti {
namespace compression {

// Uniform in [-1, 1), a multiple of 2^-23 (exact in float32).
TUTTI_HD float hash_uniform_hd(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + stream * 0xd1b54a32d192ed03ull +
               index * 0xbf58476d1ce4e5b9ull + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int32_t>(z >> 40) - (1 << 23)) *
         (1.0f / static_cast<float>(1 << 23));
}

}  // namespace compression
}  // namespace tutti
