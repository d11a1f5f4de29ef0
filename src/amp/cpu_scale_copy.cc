// Host scale/cast/check: one pass that reads each source element, multiplies
// it in float32, rounds it once into the destination type and folds "is the
// written value non-finite" into a running maximum of absolute-value bit
// patterns (a value is non-finite iff its magnitude bits reach the
// exponent-all-ones pattern), so the loop has no branches.
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

// Element types by position: 0 float32, 1 float16, 2 bfloat16.
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2;

int type_code(DType d) {
  switch (d) {
    case DType::kFloat32: return kF32;
    case DType::kFloat16: return kF16;
    case DType::kBFloat16: return kBF16;
    default:
      TUTTI_THROW(kInvalidArgument, "amp multi-tensor ops take float32, float16 "
                  "or bfloat16 tensors, not ", dtype_name(d));
  }
}

// Magnitude bits at or above which a value of the type is NaN or Inf.
template <int D>
constexpr uint32_t inf_bits() {
  return D == kF32 ? 0x7f800000u : D == kF16 ? 0x7c00u : 0x7f80u;
}

// ---- scalar path (also the vector path's tail) -------------------------------

template <int S>
inline float load1(const void* p, int64_t i) {
  if (S == kF32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return S == kF16 ? half_to_float(b) : bfloat16_to_float(b);
}

// Stores v rounded into D; returns the stored value's magnitude bits.
template <int D>
inline uint32_t store1(void* p, int64_t i, float v) {
  if (D == kF32) {
    static_cast<float*>(p)[i] = v;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
  }
  const uint16_t b = D == kF16 ? float_to_half(v) : float_to_bfloat16(v);
  static_cast<uint16_t*>(p)[i] = b;
  return b & 0x7fffu;
}

template <int D>
inline uint32_t magnitude1(const void* p, int64_t i) {
  if (D == kF32) {
    uint32_t u;
    std::memcpy(&u, static_cast<const float*>(p) + i, 4);
    return u & 0x7fffffffu;
  }
  return static_cast<const uint16_t*>(p)[i] & 0x7fffu;
}

template <int S, int D>
bool scalar_loop(const void* src, void* dst, int64_t begin, int64_t n,
                 float scale, bool read_only) {
  uint32_t m = 0;
  if (read_only) {
    for (int64_t i = begin; i < n; ++i) m = std::max(m, magnitude1<D>(src, i));
  } else {
    for (int64_t i = begin; i < n; ++i)
      m = std::max(m, store1<D>(dst, i, load1<S>(src, i) * scale));
  }
  return m >= inf_bits<D>();
}

// ---- AVX2 + F16C path ---------------------------------------------------------

#if defined(__x86_64__)
#define TUTTI_AVX2 __attribute__((target("avx2,f16c")))

template <int S>
TUTTI_AVX2 inline __m256 load8(const void* p, int64_t i) {
  if (S == kF32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const __m128i h = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  if (S == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// float32 -> bfloat16 for 8 lanes with float_to_bfloat16's rounding: round
// to nearest even on the upper 16 bits, NaN kept quiet with its sign.
TUTTI_AVX2 inline __m128i to_bf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; quads 0
  // and 2 are the eight results in order.
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Stores 8 lanes rounded into D.
template <int D>
TUTTI_AVX2 inline void store8(void* p, int64_t i, __m256 v) {
  if (D == kF32) {
    _mm256_storeu_ps(static_cast<float*>(p) + i, v);
    return;
  }
  const __m128i h = D == kF16
                        ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                        : to_bf16x8(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), h);
}

// The smallest float32 magnitude (as bits) that is NaN or Inf once rounded
// to nearest even into D: Inf itself for float32; 65520 for float16 (the
// midpoint above 65504 ties to the even 65536 = Inf); for bfloat16 the
// midpoint above 0x7f7f, which ties to the even 0x7f80 = Inf.  Testing the
// float32 value against it saves widening the rounded result.
template <int D>
constexpr uint32_t rounds_to_inf_bits() {
  return D == kF32 ? 0x7f800000u : D == kF16 ? 0x477ff000u : 0x7f7f8000u;
}

TUTTI_AVX2 inline __m256i magnitude8(__m256 v) {
  return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
}

TUTTI_AVX2 inline uint32_t hmax_epu32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// Read-only check: the magnitude maximum of the raw elements.
template <int D>
TUTTI_AVX2 bool avx2_check(const void* p, int64_t n) {
  int64_t i = 0;
  __m256i acc = _mm256_setzero_si256();
  if (D == kF32) {
    const __m256i mask = _mm256_set1_epi32(0x7fffffff);
    const float* f = static_cast<const float*>(p);
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f + i + 8));
      acc = _mm256_max_epu32(acc, _mm256_and_si256(a, mask));
      acc = _mm256_max_epu32(acc, _mm256_and_si256(b, mask));
    }
  } else {
    const __m256i mask = _mm256_set1_epi16(0x7fff);
    const uint16_t* h = static_cast<const uint16_t*>(p);
    __m256i acc16 = _mm256_setzero_si256();
    for (; i + 32 <= n; i += 32) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i + 16));
      acc16 = _mm256_max_epu16(acc16, _mm256_and_si256(a, mask));
      acc16 = _mm256_max_epu16(acc16, _mm256_and_si256(b, mask));
    }
    // Widen the 16 u16 maxima to u32 lanes for the common reduction.
    acc = _mm256_max_epu32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(acc16)),
                           _mm256_cvtepu16_epi32(_mm256_extracti128_si256(acc16, 1)));
  }
  return hmax_epu32(acc) >= inf_bits<D>() ||
         scalar_loop<D, D>(p, nullptr, i, n, 1.0f, true);
}

template <int S, int D>
TUTTI_AVX2 bool avx2_loop(const void* src, void* dst, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256i acc = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_mul_ps(load8<S>(src, i), s);
    const __m256 b = _mm256_mul_ps(load8<S>(src, i + 8), s);
    store8<D>(dst, i, a);
    store8<D>(dst, i + 8, b);
    acc = _mm256_max_epu32(acc, _mm256_max_epu32(magnitude8(a), magnitude8(b)));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_mul_ps(load8<S>(src, i), s);
    store8<D>(dst, i, a);
    acc = _mm256_max_epu32(acc, magnitude8(a));
  }
  const bool tail = scalar_loop<S, D>(src, dst, i, n, scale, false);
  return hmax_epu32(acc) >= rounds_to_inf_bits<D>() || tail;
}
// bfloat16 -> bfloat16 (the in-place unscale of bfloat16 gradients), 16
// elements per 256-bit load without widening: each 32-bit lane holds two
// elements, the even one in its low half (shifted up it is a float32) and
// the odd one in its high half (masked it is a float32).  Both are rounded
// on their upper 16 bits and merged back with one word blend; the check
// runs on the stored 16-bit results.  No NaN fix-up is needed: a NaN
// product is the quieted bfloat16 source, whose low 16 bits are zero, so
// adding the rounding bias (<= 0x8000) leaves its upper half unchanged.
TUTTI_AVX2 bool avx2_bf16_to_bf16(const void* src, void* dst, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i magnitude = _mm256_set1_epi16(0x7fff);
  const uint16_t* in = static_cast<const uint16_t*>(src);
  uint16_t* out = static_cast<uint16_t*>(dst);
  __m256i acc = _mm256_setzero_si256();  // 16-bit magnitudes of the results
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    __m256i e = _mm256_castps_si256(
        _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), s));
    __m256i o = _mm256_castps_si256(
        _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), s));
    e = _mm256_add_epi32(e, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(e, 16), one)));
    o = _mm256_add_epi32(o, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(o, 16), one)));
    // Even words from the shifted even results, odd words from the odd ones.
    const __m256i r = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xaa);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
    acc = _mm256_max_epu16(acc, _mm256_and_si256(r, magnitude));
  }
  alignas(32) uint16_t m[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(m), acc);
  bool found = false;
  for (uint16_t x : m) found = found || x >= 0x7f80u;
  return scalar_loop<kBF16, kBF16>(src, dst, i, n, scale, false) || found;
}
#endif  // __x86_64__

template <int S, int D>
bool run(const void* src, void* dst, int64_t n, float scale, bool read_only) {
#if defined(__x86_64__)
  if (cpu_has_avx2_f16c()) {
    if (read_only) return avx2_check<D>(src, n);
    if (S == kBF16 && D == kBF16) return avx2_bf16_to_bf16(src, dst, n, scale);
    return avx2_loop<S, D>(src, dst, n, scale);
  }
#endif
  return scalar_loop<S, D>(src, dst, 0, n, scale, read_only);
}

using RunFn = bool (*)(const void*, void*, int64_t, float, bool);
const RunFn kRun[3][3] = {
    {run<kF32, kF32>, run<kF32, kF16>, run<kF32, kBF16>},
    {run<kF16, kF32>, run<kF16, kF16>, run<kF16, kBF16>},
    {run<kBF16, kF32>, run<kBF16, kF16>, run<kBF16, kBF16>},
};

}  // namespace

bool cpu_scale_copy(const void* src, DType src_dtype, void* dst,
                    DType dst_dtype, int64_t n, float scale) {
  const int s = type_code(src_dtype), d = type_code(dst_dtype);
  if (n <= 0) return false;
  const bool read_only = src == dst && s == d && scale == 1.0f;
  return kRun[s][d](src, dst, n, scale, read_only);
}

}  // namespace amp
}  // namespace tutti
