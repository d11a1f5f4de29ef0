// Multi-tensor norms: every block reduces one chunk to (sum of squares, max
// magnitude) in float32 and writes it to its own slot of a dense partials
// array; the host adds the partials per tensor in float64, in chunk order.
// No atomics, so the result is deterministic: data-parallel replicas with
// identical gradients compute identical clip coefficients.
#include "kernels/amp_norm.h"

#include "core/check.h"
#include "core/cuda_utils.h"
#include "amp/multi_tensor_plan.h"
#include "kernels/amp_elementwise.cuh"

namespace tutti {
namespace amp {
namespace {

constexpr int kThreads = 512;

template <typename T>
__device__ void norm_chunk(const T* p, int64_t n, float prescale, float* sum,
                           uint32_t* max_bits) {
  float s = 0;
  uint32_t m = 0;
  dev::for_each_loaded(p, n, [&](T x) {
    const float v = dev::widen(x) * prescale;
    s += v * v;
    m = max(m, dev::magnitude(v));
  });
  *sum = s;
  *max_bits = m;
}

__global__ void __launch_bounds__(kThreads)
    amp_norm_kernel(const MtaTable table, float2* partials) {
  const int slot = table.block_slot[blockIdx.x];
  const int32_t chunk = table.block_chunk[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(chunk) * MtaTable::kChunk;
  const int64_t left = table.numel[slot] - begin;
  const int64_t n = left < MtaTable::kChunk ? left : MtaTable::kChunk;
  const float prescale = table.prescale[slot];
  const void* src = table.src[slot];
  float s = 0;
  uint32_t m = 0;
  switch (table.src_dtype[slot]) {
    case kMtaF32: norm_chunk(static_cast<const float*>(src) + begin, n, prescale, &s, &m); break;
    case kMtaF16: norm_chunk(static_cast<const __half*>(src) + begin, n, prescale, &s, &m); break;
    case kMtaBF16: norm_chunk(static_cast<const __nv_bfloat16*>(src) + begin, n, prescale, &s, &m); break;
    default: break;  // rejected by the launcher
  }
  // Warp, then block reduction (magnitude bits: NaN's exceed Inf's).
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_down_sync(0xffffffffu, s, o);
    m = max(m, __shfl_down_sync(0xffffffffu, m, o));
  }
  __shared__ float warp_sum[kThreads / 32];
  __shared__ uint32_t warp_max[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_sum[warp] = s;
    warp_max[warp] = m;
  }
  __syncthreads();
  if (warp == 0) {
    s = lane < kThreads / 32 ? warp_sum[lane] : 0.0f;
    m = lane < kThreads / 32 ? warp_max[lane] : 0u;
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_down_sync(0xffffffffu, s, o);
      m = max(m, __shfl_down_sync(0xffffffffu, m, o));
    }
    if (lane == 0)
      partials[table.chunk_base[slot] + chunk] = make_float2(s, __uint_as_float(m));
  }
}

}  // namespace

void launch_amp_norm_partials(const MtaTable& table, float2* partials,
                              cudaStream_t stream) {
  check_table(table, "amp_norm", false);
  TUTTI_ARG_CHECK(partials != nullptr, "amp_norm: null partials");
  amp_norm_kernel<<<table.n_blocks, kThreads, 0, stream>>>(table, partials);
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace amp
}  // namespace tutti
