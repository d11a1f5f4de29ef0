// Host sum of squares and max-abs of one tensor, in one pass.  Blocks of
// kBlock elements are summed in float32 lanes (each lane adds 128 terms,
// as many as one CUDA thread adds serially in kernels/amp_norm.cu) and the
// block sums in float64, so the error does not grow with the tensor size.
#include <algorithm>
#include <cstring>

#include "amp/cpu_features.h"
#include "amp/cpu_multi_tensor.h"
#include "core/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tutti {
namespace amp {
namespace {

constexpr int64_t kBlock = 2048;

inline float element(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

inline uint32_t magnitude(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x7fffffffu;
}

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One block, scalar: float32 sum, magnitude-bit maximum (NaN bits exceed
// Inf's, so a NaN wins the maximum and comes back as NaN).
void scalar_block(const void* x, DType d, int64_t begin, int64_t end,
                  float prescale, float* sum, uint32_t* max_bits) {
  float s = 0;
  uint32_t m = 0;
  for (int64_t i = begin; i < end; ++i) {
    const float v = element(x, d, i) * prescale;
    s += v * v;
    m = std::max(m, magnitude(v));
  }
  *sum += s;
  *max_bits = std::max(*max_bits, m);
}

#if defined(__x86_64__)
#define TUTTI_AVX2 __attribute__((target("avx2,f16c")))

TUTTI_AVX2 inline __m256 load8(const void* p, DType d, int64_t i) {
  if (d == DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const __m128i h = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  if (d == DType::kFloat16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Two independent accumulators hide the add latency; the reduction order
// is fixed, so results are deterministic.
TUTTI_AVX2 void avx2_block(const void* x, DType d, int64_t begin, int64_t end,
                           float prescale, float* sum, uint32_t* max_bits) {
  const __m256 ps = _mm256_set1_ps(prescale);
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  __m256i m = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 a = _mm256_mul_ps(load8(x, d, i), ps);
    const __m256 b = _mm256_mul_ps(load8(x, d, i + 8), ps);
    s0 = _mm256_add_ps(s0, _mm256_mul_ps(a, a));
    s1 = _mm256_add_ps(s1, _mm256_mul_ps(b, b));
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(a), mask));
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(b), mask));
  }
  alignas(32) float lanes[8];
  alignas(32) uint32_t mb[8];
  _mm256_store_ps(lanes, _mm256_add_ps(s0, s1));
  _mm256_store_si256(reinterpret_cast<__m256i*>(mb), m);
  float s = 0;
  uint32_t mx = 0;
  for (int k = 0; k < 8; ++k) {
    s += lanes[k];
    mx = std::max(mx, mb[k]);
  }
  *sum += s;
  *max_bits = std::max(*max_bits, mx);
  scalar_block(x, d, i, end, prescale, sum, max_bits);
}
#endif

}  // namespace

CpuNorm cpu_norm(const void* x, DType dtype, int64_t n, float prescale) {
  TUTTI_ARG_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
                      dtype == DType::kBFloat16,
                  "amp norms take float32, float16 or bfloat16 tensors, not ",
                  dtype_name(dtype));
  double total = 0;
  uint32_t max_bits = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float block = 0;
#if defined(__x86_64__)
    if (cpu_has_avx2_f16c())
      avx2_block(x, dtype, begin, end, prescale, &block, &max_bits);
    else
#endif
      scalar_block(x, dtype, begin, end, prescale, &block, &max_bits);
    total += block;
  }
  CpuNorm r;
  r.sum_squares = total;
  r.max_abs = from_bits(max_bits);
  return r;
}

}  // namespace amp
}  // namespace tutti
