#include "core/fast_convert.h"

#include <cstring>

#include "tutti/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tutti {
namespace {

#if defined(__x86_64__)
// F16C through cpuid (leaf 1, ECX bit 29): clang's __builtin_cpu_supports
// does not know "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}

bool have_f16c() {
  static const bool has = cpu_has_f16c() && __builtin_cpu_supports("avx2");
  return has;
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* src,
                                                          uint16_t* dst,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* src,
                                                          float* dst,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
#endif

}  // namespace

void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
#if defined(__x86_64__)
  if (have_f16c()) return f32_to_f16_f16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
#if defined(__x86_64__)
  if (have_f16c()) return f16_to_f32_f16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

// Branch-free so the compiler vectorises it; the same rounding as
// float_to_bfloat16().
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + i, 4);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
    dst[i] = static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
  }
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &x, 4);
  }
}

}  // namespace tutti
