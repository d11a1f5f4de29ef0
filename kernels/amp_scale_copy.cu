// Multi-tensor scale + cast + non-finite check: one launch covers up to
// MtaTable::kMaxBlocks chunks of up to kMaxTensors tensors of mixed sizes
// and of float32/float16/bfloat16 in any source/destination combination.
// Each block owns one chunk; its dtype pair is uniform, so the switch below
// does not diverge.  The non-finite test is on the stored value, which
// covers non-finite inputs (scale is finite and positive) and overflow in
// the destination type with a single compare.
#include "kernels/amp_scale_copy.h"

#include "core/check.h"
#include "core/cuda_utils.h"
#include "amp/multi_tensor_plan.h"
#include "kernels/amp_elementwise.cuh"

namespace tutti {
namespace amp {
namespace {

constexpr int kThreads = 512;
constexpr int kVec = 4;  // elements per vector access

// dst[i] = round(src[i] * scale) over one chunk of n elements; returns the
// largest magnitude bits this thread stored.
template <typename S, typename D>
__device__ uint32_t scale_copy_chunk(const S* src, D* dst, int64_t n,
                                     float scale) {
  uint32_t m = 0;
  int64_t tail = 0;
  if (dev::aligned_for<S, kVec>(src) && dev::aligned_for<D, kVec>(dst)) {
    const int64_t packs = n / kVec;
    const auto* in = reinterpret_cast<const dev::Pack<S, kVec>*>(src);
    auto* out = reinterpret_cast<dev::Pack<D, kVec>*>(dst);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const dev::Pack<S, kVec> a = in[p];
      dev::Pack<D, kVec> b;
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        m = max(m, dev::round_store(dev::widen(a.v[k]) * scale, &b.v[k]));
      out[p] = b;
    }
    tail = packs * kVec;
  }
  for (int64_t i = tail + threadIdx.x; i < n; i += blockDim.x)
    m = max(m, dev::round_store(dev::widen(src[i]) * scale, &dst[i]));
  return m;
}

// Read-only check of one chunk.
template <typename T>
__device__ uint32_t check_chunk(const T* p, int64_t n) {
  uint32_t m = 0;
  dev::for_each_loaded(p, n, [&](T v) { m = max(m, dev::magnitude(v)); });
  return m;
}

template <int SD, int DD>
__device__ bool run_pair(const void* src, void* dst, int64_t begin, int64_t n,
                         float scale) {
  using S = typename dev::Elem<SD>::type;
  using D = typename dev::Elem<DD>::type;
  const S* s = static_cast<const S*>(src) + begin;
  if (SD == DD && src == dst && scale == 1.0f)
    return check_chunk(s, n) >= dev::Elem<DD>::kInfBits;
  D* d = static_cast<D*>(dst) + begin;
  return scale_copy_chunk(s, d, n, scale) >= dev::Elem<DD>::kInfBits;
}

// The table is read field by field (never by reference, which would copy
// the whole parameter block into local memory).
__global__ void __launch_bounds__(kThreads)
    amp_scale_copy_kernel(const MtaTable table, float scale, int32_t* flags) {
  const int slot = table.block_slot[blockIdx.x];
  const int64_t begin =
      static_cast<int64_t>(table.block_chunk[blockIdx.x]) * MtaTable::kChunk;
  const int64_t left = table.numel[slot] - begin;
  const int64_t n = left < MtaTable::kChunk ? left : MtaTable::kChunk;
  const void* src = table.src[slot];
  void* dst = table.dst[slot];
  bool found = false;
  switch (table.src_dtype[slot] * 3 + table.dst_dtype[slot]) {
    case kMtaF32 * 3 + kMtaF32: found = run_pair<kMtaF32, kMtaF32>(src, dst, begin, n, scale); break;
    case kMtaF32 * 3 + kMtaF16: found = run_pair<kMtaF32, kMtaF16>(src, dst, begin, n, scale); break;
    case kMtaF32 * 3 + kMtaBF16: found = run_pair<kMtaF32, kMtaBF16>(src, dst, begin, n, scale); break;
    case kMtaF16 * 3 + kMtaF32: found = run_pair<kMtaF16, kMtaF32>(src, dst, begin, n, scale); break;
    case kMtaF16 * 3 + kMtaF16: found = run_pair<kMtaF16, kMtaF16>(src, dst, begin, n, scale); break;
    case kMtaF16 * 3 + kMtaBF16: found = run_pair<kMtaF16, kMtaBF16>(src, dst, begin, n, scale); break;
    case kMtaBF16 * 3 + kMtaF32: found = run_pair<kMtaBF16, kMtaF32>(src, dst, begin, n, scale); break;
    case kMtaBF16 * 3 + kMtaF16: found = run_pair<kMtaBF16, kMtaF16>(src, dst, begin, n, scale); break;
    case kMtaBF16 * 3 + kMtaBF16: found = run_pair<kMtaBF16, kMtaBF16>(src, dst, begin, n, scale); break;
    default: break;  // rejected by the launcher
  }
  // One write per block that saw a non-finite value; the report per tensor
  // costs nothing on clean steps.
  if (__syncthreads_or(found) && threadIdx.x == 0) flags[table.index[slot]] = 1;
}

}  // namespace

void launch_amp_scale_copy(const MtaTable& table, float scale, int32_t* flags,
                           cudaStream_t stream) {
  check_table(table, "amp_scale_copy", true);
  TUTTI_ARG_CHECK(flags != nullptr, "amp_scale_copy: null flags");
  TUTTI_ARG_CHECK(scale > 0 && scale <= 3.4028235e38f, "amp_scale_copy: scale ",
                  scale, " is not finite and positive");
  amp_scale_copy_kernel<<<table.n_blocks, kThreads, 0, stream>>>(table, scale, flags);
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace amp
}  // namespace tutti
