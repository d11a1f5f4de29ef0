// The per-element optimizer arithmetic shared by the host loop
// (src/optim/cpu_optim.cc, scalar float and AVX2 lanes) and the CUDA kernel
// (kernels/optim_step.cu).  One source for the expression keeps the two
// paths bit-identical; the tests still compare them, since indexing, chunking
// and dtype handling differ.
//
// Every operation is spelled out (o_mul, o_add, o_fma, ...), because the
// result must be rounded exactly where torch.optim's CPU kernels round it:
// a fused multiply-add where ATen's kernels call vec::fmadd (add with alpha,
// lerp) or where GCC contracts their vector expression (addcmul_: self +
// (value*t1)*t2), separate roundings elsewhere (mul_, div, addcdiv_'s
// quotient and sum).  Measured against torch's CPU build, bit for bit
// (tests/optim/test_optim_torch.py).  Compilers must not contract these
// operations further: the device side uses the _rn intrinsics (nvcc never
// fuses them), the host file turns contraction off (cpu_optim.cc).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TUTTI_OPT_HD __host__ __device__ __forceinline__
#else
#define TUTTI_OPT_HD inline
#endif

namespace tutti {
namespace optim {

// The step's scalars, derived once per call on the host (optim.cc:
// make_coeffs) in double, rounded to float32 where torch converts its Python
// float to the tensor's dtype.  Plain data: it travels as a kernel argument.
struct Coeffs {
  float grad_scale;        // g = float(grad) * grad_scale
  float weight_decay;      // L2: g = fma(p, wd, g)            (grad.add(p, alpha=wd))
  float decay;             // AdamW: p = p * float(1 - lr*wd)  (p.mul_(1 - lr*wd))
  float neg_lr;            // SGD: p = fma(g, float(-lr), p)   (p.add_(g, alpha=-lr))
  float momentum;          // SGD: buf = fma(g, 1-d, buf*mom)  (buf.mul_(m).add_(g, alpha=1-d))
  float one_minus_dampening;
  float lerp_coeff;        // Adam: m = fma(lerp_coeff, g - m, lerp_small ? m : g)
  float beta2;             //       v = fma((1-b2)*g, g, v*b2)
                           //       (v.mul_(b2).addcmul_(g, g, value=1-b2))
  float one_minus_beta2;
  float bc2_sqrt;          //       denom = sqrt(v) / bc2_sqrt + eps
  float eps;
  float neg_step_size;     //       p = p + (float(-lr/bc1) * m) / denom
  uint8_t kind;            // optim::Kind
  uint8_t maximize;
  uint8_t has_weight_decay;
  uint8_t has_momentum;    // SGD momentum != 0
  uint8_t first;           // SGD: step == 1, buf = g
  uint8_t nesterov;
  uint8_t lerp_small;      // |float(1 - beta1)| < 0.5 (ATen's lerp branch)
  uint8_t pad_ = 0;
};

// ---- float lanes: host and device ---------------------------------------------

TUTTI_OPT_HD float o_splat(float x, float) { return x; }
TUTTI_OPT_HD float o_neg(float a) { return -a; }
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float o_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float o_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float o_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float o_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float o_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ float o_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
inline float o_mul(float a, float b) { return a * b; }
inline float o_add(float a, float b) { return a + b; }
inline float o_sub(float a, float b) { return a - b; }
inline float o_div(float a, float b) { return a / b; }
inline float o_sqrt(float a) { return std::sqrt(a); }
inline float o_fma(float a, float b, float c) { return std::fma(a, b, c); }
#endif

// ---- the updates, for any lane type V with the o_* operations ------------------

// g: the gradient already widened to float and multiplied by grad_scale.
// buf: the momentum buffer (read only when !c.first).
template <typename V>
TUTTI_OPT_HD void sgd_update(const Coeffs& c, V& p, V g, V& buf) {
  if (c.maximize) g = o_neg(g);
  if (c.has_weight_decay) g = o_fma(p, o_splat(c.weight_decay, V()), g);
  if (c.has_momentum) {
    if (c.first) {
      buf = g;
    } else {
      const V scaled = o_mul(buf, o_splat(c.momentum, V()));
      buf = o_fma(g, o_splat(c.one_minus_dampening, V()), scaled);
    }
    g = c.nesterov ? o_fma(buf, o_splat(c.momentum, V()), g) : buf;
  }
  p = o_fma(g, o_splat(c.neg_lr, V()), p);
}

// Adam (kind kAdam: L2 weight decay on the gradient) and AdamW (decoupled).
template <typename V>
TUTTI_OPT_HD void adam_update(const Coeffs& c, V& p, V g, V& m, V& v) {
  if (c.maximize) g = o_neg(g);
  if (c.has_weight_decay) {
    if (c.kind == 2)
      p = o_mul(p, o_splat(c.decay, V()));
    else
      g = o_fma(p, o_splat(c.weight_decay, V()), g);
  }
  const V diff = o_sub(g, m);
  m = o_fma(o_splat(c.lerp_coeff, V()), diff, c.lerp_small ? m : g);
  // addcmul_ (self + value*t1*t2) is fused as built by GCC: one rounding of
  // value*t1, then fma(value*t1, t2, self); mul_ rounds first.
  const V v_decayed = o_mul(v, o_splat(c.beta2, V()));
  const V g_scaled = o_mul(o_splat(c.one_minus_beta2, V()), g);
  v = o_fma(g_scaled, g, v_decayed);
  const V root = o_div(o_sqrt(v), o_splat(c.bc2_sqrt, V()));
  const V denom = o_add(root, o_splat(c.eps, V()));
  const V num = o_mul(o_splat(c.neg_step_size, V()), m);
  p = o_add(p, o_div(num, denom));
}

}  // namespace optim
}  // namespace tutti
