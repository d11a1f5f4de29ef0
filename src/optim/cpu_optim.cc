// Host optimizer step.  Each parameter is processed in blocks of kBlock
// elements: the gradient block is widened and scaled into a float32 buffer
// by amp's scale/copy loop (unless it is float32 with grad_scale 1), the
// update runs over float lanes, and the model copy block is rounded by the
// same amp loop while the parameters are still in L1.  One read of every
// input and one write of every output, as in the CUDA kernel.
// GCC contracts a*b + c into an FMA by default in C++ (-ffp-contract=fast),
// across statements and across _mm256_* intrinsics; the expression of
// optim_math.h places its FMAs itself, so contraction is off for this file
// (before any include, so every inlined function shares the setting).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "optim/cpu_optim.h"

#include <algorithm>

#include "amp/cpu_multi_tensor.h"
#include "core/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tutti {
namespace optim {
namespace {

constexpr int64_t kBlock = 1024;  // 4 KiB of widened gradient on the stack

// Scalar lanes for elements [begin, n) of one block.
void update_scalar(const Coeffs& c, float* p, const float* g, float* s0,
                   float* s1, int64_t begin, int64_t n) {
  if (c.kind == 0) {
    for (int64_t i = begin; i < n; ++i) {
      float buf = s0 ? s0[i] : 0.f;
      sgd_update(c, p[i], g[i], buf);
      if (s0) s0[i] = buf;
    }
  } else {
    for (int64_t i = begin; i < n; ++i) adam_update(c, p[i], g[i], s0[i], s1[i]);
  }
}

#if defined(__x86_64__)
// The lane operations carry the AVX2 target; update_avx2 is flattened, so
// the templates of optim_math.h and these operations are all inlined into
// it (a template cannot carry the target itself: its float instantiation
// must run on any x86-64).
#define TUTTI_OPT_AVX2 __attribute__((target("avx2,fma,f16c"))) inline

// Eight float lanes; a struct (not a bare __m256) so that the o_* overloads
// below are found by argument-dependent lookup from the templates in
// optim_math.h.
struct F8 {
  __m256 v;
};
TUTTI_OPT_AVX2 F8 o_splat(float x, F8) { return {_mm256_set1_ps(x)}; }
TUTTI_OPT_AVX2 F8 o_neg(F8 a) { return {_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))}; }
TUTTI_OPT_AVX2 F8 o_mul(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
TUTTI_OPT_AVX2 F8 o_add(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
TUTTI_OPT_AVX2 F8 o_sub(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
TUTTI_OPT_AVX2 F8 o_div(F8 a, F8 b) { return {_mm256_div_ps(a.v, b.v)}; }
TUTTI_OPT_AVX2 F8 o_sqrt(F8 a) { return {_mm256_sqrt_ps(a.v)}; }
TUTTI_OPT_AVX2 F8 o_fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
TUTTI_OPT_AVX2 F8 load8(const float* p) { return {_mm256_loadu_ps(p)}; }
TUTTI_OPT_AVX2 void store8(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }

__attribute__((target("avx2,fma,f16c"), flatten)) void update_avx2(
    const Coeffs& c, float* p, const float* g, float* s0, float* s1, int64_t n) {
  int64_t i = 0;
  if (c.kind == 0) {
    for (; i + 8 <= n; i += 8) {
      F8 pv = load8(p + i);
      F8 buf = s0 ? load8(s0 + i) : F8{_mm256_setzero_ps()};
      sgd_update(c, pv, load8(g + i), buf);
      store8(p + i, pv);
      if (s0) store8(s0 + i, buf);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      F8 pv = load8(p + i), m = load8(s0 + i), v = load8(s1 + i);
      adam_update(c, pv, load8(g + i), m, v);
      store8(p + i, pv);
      store8(s0 + i, m);
      store8(s1 + i, v);
    }
  }
  update_scalar(c, p, g, s0, s1, i, n);
}
#endif

}  // namespace

bool cpu_step_vectorised() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

void cpu_step(const Entry& e, const Coeffs& c, bool vector) {
  const bool use_avx2 = vector && cpu_step_vectorised();
  const size_t grad_size = dtype_size(e.grad_dtype);
  const size_t copy_size = dtype_size(e.copy_dtype);
  const bool direct = e.grad_dtype == DType::kFloat32 && c.grad_scale == 1.0f;
  float gbuf[kBlock];
  for (int64_t off = 0; off < e.numel; off += kBlock) {
    const int64_t n = std::min(kBlock, e.numel - off);
    const float* g = static_cast<const float*>(e.grad) + off;
    if (!direct) {
      amp::cpu_scale_copy(static_cast<const char*>(e.grad) + off * grad_size,
                          e.grad_dtype, gbuf, DType::kFloat32, n, c.grad_scale);
      g = gbuf;
    }
    float* p = e.param + off;
    float* s0 = e.state0 ? e.state0 + off : nullptr;
    float* s1 = e.state1 ? e.state1 + off : nullptr;
#if defined(__x86_64__)
    if (use_avx2)
      update_avx2(c, p, g, s0, s1, n);
    else
#endif
      update_scalar(c, p, g, s0, s1, 0, n);
    if (e.copy)
      amp::cpu_scale_copy(p, DType::kFloat32,
                          static_cast<char*>(e.copy) + off * copy_size,
                          e.copy_dtype, n, 1.0f);
  }
}

}  // namespace optim
}  // namespace tutti
