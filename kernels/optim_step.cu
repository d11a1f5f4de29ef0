// Fused optimizer step over up to OptTable::kMaxBlocks chunks of up to
// kMaxTensors parameters.  Each block owns one 64 Ki-element chunk of one
// parameter, so its dtypes and pointers are uniform and the switches below
// do not diverge.  Threads stride through the chunk (consecutive threads,
// consecutive elements: coalesced), read every input once and write every
// output once.  The arithmetic is optim_math.h with correctly rounded
// intrinsics, identical to the host loop.
#include "kernels/optim_step.h"

#include "core/check.h"
#include "core/cuda_utils.h"
#include "kernels/amp_elementwise.cuh"
#include "optim/cuda_optim.h"

namespace tutti {
namespace optim {
namespace {

constexpr int kThreads = 512;

template <typename G>
__device__ __forceinline__ float load_grad(const void* p, int64_t i) {
  return amp::dev::widen(static_cast<const G*>(p)[i]);
}

__device__ __forceinline__ void store_copy(void* p, uint8_t dtype, int64_t i,
                                           float v) {
  switch (dtype) {
    case amp::kMtaF32: static_cast<float*>(p)[i] = v; break;
    case amp::kMtaF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
  }
}

// One chunk [begin, end) of one parameter.  Everything arrives by value:
// taking the address of the kernel's argument table could make the compiler
// copy its 4 KiB to local memory.
template <typename G>
__device__ __forceinline__ void step_chunk(float* param, const void* grad, float* s0,
                                          float* s1, void* copy, uint8_t copy_dtype,
                                          const Coeffs c, int64_t begin, int64_t end) {
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float p = param[i];
    const float g = __fmul_rn(load_grad<G>(grad, i), c.grad_scale);
    if (c.kind == 0) {
      float buf = (s0 && !c.first) ? s0[i] : 0.f;
      sgd_update(c, p, g, buf);
      if (s0) s0[i] = buf;
    } else {
      float m = s0[i], v = s1[i];
      adam_update(c, p, g, m, v);
      s0[i] = m;
      s1[i] = v;
    }
    param[i] = p;
    if (copy) store_copy(copy, copy_dtype, i, p);
  }
}

__global__ void __launch_bounds__(kThreads)
    optim_step_kernel(const OptTable t, const Coeffs c) {
  const int slot = t.block_slot[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(t.block_chunk[blockIdx.x]) * OptTable::kChunk;
  const int64_t n = t.numel[slot];
  const int64_t end = begin + OptTable::kChunk < n ? begin + OptTable::kChunk : n;
  float* const param = t.param[slot];
  const void* const grad = t.grad[slot];
  float* const s0 = t.state0[slot];
  float* const s1 = t.state1[slot];
  void* const copy = t.copy[slot];
  const uint8_t cd = t.copy_dtype[slot];
  switch (t.grad_dtype[slot]) {
    case amp::kMtaF32: step_chunk<float>(param, grad, s0, s1, copy, cd, c, begin, end); break;
    case amp::kMtaF16: step_chunk<__half>(param, grad, s0, s1, copy, cd, c, begin, end); break;
    default: step_chunk<__nv_bfloat16>(param, grad, s0, s1, copy, cd, c, begin, end); break;
  }
}

}  // namespace

void launch_optim_step(const OptTable& t, const Coeffs& c, cudaStream_t stream) {
  check_opt_table(t, c);
  optim_step_kernel<<<t.n_blocks, kThreads, 0, stream>>>(t, c);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    TUTTI_THROW(kCuda, "optim_step: launch of ", t.n_blocks, " blocks over ",
                t.n_tensors, " tensors (kind ", int(c.kind), ") failed: ",
                cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  TUTTI_LAUNCH_CHECK(stream);  // the device discipline (TUTTI_CHECK_DEVICE)
}

}  // namespace optim
}  // namespace tutti
