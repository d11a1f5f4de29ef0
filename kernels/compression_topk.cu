// Top-k selection and decoding kernels (see kernels/compression_topk.h; CPU
// references in src/compression/topk.cc).
#include "kernels/compression_topk.h"

#include "compression/topk_bins.h"
#include "kernels/compression_device.cuh"

namespace tutti {
namespace kernels {
namespace {

constexpr int kItems = 16;  // per thread in a tile
constexpr int kTileThreads = static_cast<int>(kTopkTile / kItems);
static_assert(kTileThreads == 256, "tile geometry");

__device__ __forceinline__ uint32_t key_of(float x) {
  return __float_as_uint(x) & 0x7fffffffu;
}

// Level geometry: level 0 looks at bits 30..20, level 1 at 19..10, level 2
// at 9..0.
__host__ __device__ inline int level_shift(int level) { return level == 0 ? 20 : level == 1 ? 10 : 0; }
__host__ __device__ inline int level_bins(int level) { return level == 0 ? 2048 : 1024; }

__global__ void histogram_kernel(const float* x, int64_t n, int level,
                                 const TopkDeviceState* state, uint32_t* hist) {
  __shared__ uint32_t local[kTopkHistBins];
  const int bins = level_bins(level), shift = level_shift(level);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const int high = shift + (level == 0 ? 11 : 10);  // bits above this level
  const uint32_t want = level == 0 ? 0u : (state->prefix >> high);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t key = key_of(x[i]);
    if (level == 0 || (key >> high) == want)
      atomicAdd(&local[(key >> shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (local[b]) atomicAdd(&hist[b], local[b]);
}

// One block: thread t holds bins / kPickThreads consecutive bins from the
// top; an exclusive scan of the chunk totals gives each chunk the count
// above it, and the one thread whose chunk holds the k-th largest key
// updates the state (compression/topk_bins.h, shared with the CPU).
constexpr int kPickThreads = 1024;
static_assert(kTopkHistBins % kPickThreads == 0 && 1024 % kPickThreads == 0,
              "pick_bin chunks");

__global__ void pick_bin_kernel(const uint32_t* hist, int level, int64_t k,
                                TopkDeviceState* state) {
  const int bins = level_bins(level), shift = level_shift(level);
  const int per = bins / kPickThreads;
  // Every thread reads the state before the scan's barriers; only the
  // winner writes it, after them.
  const int64_t remaining = level == 0 ? k : state->remaining;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;
  int64_t mine = 0;
  for (int q = 0; q < per; ++q) mine += hist[top - q];
  int64_t total;
  const int64_t before = dev::block_exclusive_scan(mine, &total);
  int64_t before_bin = 0;
  const int b = compression::topk_find_bin(hist, top, per, before, remaining,
                                           &before_bin);
  if (b >= 0) {
    const uint32_t prefix = level == 0 ? 0u : state->prefix;
    const int64_t above = level == 0 ? 0 : state->above;
    state->above = above + before_bin;
    state->remaining = remaining - before_bin;
    state->prefix = prefix | (static_cast<uint32_t>(b) << shift);
  }
}

// Counts of this thread's kItems contiguous elements above / at threshold.
__device__ inline void thread_counts(const float* x, int64_t n, uint32_t t,
                                     int64_t base, int64_t* above,
                                     int64_t* ties) {
  int64_t a = 0, e = 0;
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = base + j;
    if (i >= n) break;
    const uint32_t key = key_of(x[i]);
    a += key > t;
    e += key == t;
  }
  *above = a;
  *ties = e;
}

__global__ void tile_count_kernel(const float* x, int64_t n,
                                  const TopkDeviceState* state,
                                  int64_t* tile_above, int64_t* tile_ties) {
  const int64_t base = blockIdx.x * kTopkTile + int64_t(threadIdx.x) * kItems;
  int64_t a, e;
  thread_counts(x, n, state->prefix, base, &a, &e);
  const int64_t sa = dev::block_sum<int64_t>(a);
  const int64_t se = dev::block_sum<int64_t>(e);
  if (threadIdx.x == 0) {
    tile_above[blockIdx.x] = sa;
    tile_ties[blockIdx.x] = se;
  }
}

__global__ void tile_scan_kernel(int64_t* tile_above, int64_t* tile_ties,
                                 int64_t ntiles) {
  int64_t carry_a = 0, carry_e = 0;
  for (int64_t off = 0; off < ntiles; off += blockDim.x) {
    const int64_t i = off + threadIdx.x;
    const int64_t a = i < ntiles ? tile_above[i] : 0;
    const int64_t e = i < ntiles ? tile_ties[i] : 0;
    int64_t ta, te;
    const int64_t xa = dev::block_exclusive_scan(a, &ta);
    const int64_t xe = dev::block_exclusive_scan(e, &te);
    if (i < ntiles) {
      tile_above[i] = carry_a + xa;
      tile_ties[i] = carry_e + xe;
    }
    carry_a += ta;
    carry_e += te;
  }
}

__global__ void compact_kernel(float* x, int64_t n,
                               const TopkDeviceState* state,
                               const int64_t* tile_above,
                               const int64_t* tile_ties, uint32_t* indices,
                               float* values) {
  const uint32_t t = state->prefix;
  const int64_t above_total = state->above, need = state->remaining;
  const int64_t base = blockIdx.x * kTopkTile + int64_t(threadIdx.x) * kItems;
  int64_t a, e, unused;
  thread_counts(x, n, t, base, &a, &e);
  int64_t pos = tile_above[blockIdx.x] + dev::block_exclusive_scan(a, &unused);
  int64_t tie = tile_ties[blockIdx.x] + dev::block_exclusive_scan(e, &unused);
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = base + j;
    if (i >= n) break;
    const float v = x[i];
    const uint32_t key = key_of(v);
    if (key > t) {
      indices[pos] = static_cast<uint32_t>(i);
      values[pos] = v;
      x[i] = 0.0f;
      ++pos;
    } else if (key == t) {
      if (tie < need) {
        indices[above_total + tie] = static_cast<uint32_t>(i);
        values[above_total + tie] = v;
        x[i] = 0.0f;
      }
      ++tie;
    }
  }
}

__global__ void scatter_add_kernel(const uint32_t* indices, const float* values,
                                   int64_t k, float* out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < k;
       j += int64_t(gridDim.x) * blockDim.x)
    out[indices[j]] = out[indices[j]] + values[j];
}

void check_level(int level) {
  TUTTI_ARG_CHECK(level >= 0 && level <= 2, "topk: level ", level,
                  " is not 0, 1 or 2");
}

}  // namespace

void launch_topk_histogram(const float* x, int64_t n, int level,
                           const TopkDeviceState* state, uint32_t* hist,
                           cudaStream_t stream) {
  check_level(level);
  TUTTI_ARG_CHECK(n >= 0 && n <= 0x7fffffffLL, "topk_histogram: ", n,
                  " elements (at most 2^31 - 1)");
  TUTTI_ARG_CHECK(hist && state && (n == 0 || x), "topk_histogram: null pointer");
  TUTTI_CUDA_CHECK(cudaMemsetAsync(hist, 0, kTopkHistBins * sizeof(uint32_t), stream));
  if (n == 0) return;
  histogram_kernel<<<dev::grid_for(n, 256) < 1024 ? dev::grid_for(n, 256) : 1024,
                     256, 0, stream>>>(x, n, level, state, hist);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_topk_pick_bin(const uint32_t* hist, int level, int64_t k,
                          TopkDeviceState* state, cudaStream_t stream) {
  check_level(level);
  TUTTI_ARG_CHECK(k >= 1, "topk_pick_bin: k = ", k, " must be >= 1");
  TUTTI_ARG_CHECK(hist && state, "topk_pick_bin: null pointer");
  pick_bin_kernel<<<1, kPickThreads, 0, stream>>>(hist, level, k, state);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_topk_tile_count(const float* x, int64_t n,
                            const TopkDeviceState* state, int64_t* tile_above,
                            int64_t* tile_ties, cudaStream_t stream) {
  TUTTI_ARG_CHECK(n >= 0, "topk_tile_count: negative n ", n);
  TUTTI_ARG_CHECK(state && tile_above && tile_ties && (n == 0 || x),
                  "topk_tile_count: null pointer");
  if (n == 0) return;
  tile_count_kernel<<<static_cast<unsigned>(topk_tiles(n)), kTileThreads, 0,
                      stream>>>(x, n, state, tile_above, tile_ties);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_topk_tile_scan(int64_t* tile_above, int64_t* tile_ties,
                           int64_t ntiles, cudaStream_t stream) {
  TUTTI_ARG_CHECK(ntiles >= 0, "topk_tile_scan: negative tile count ", ntiles);
  TUTTI_ARG_CHECK(ntiles == 0 || (tile_above && tile_ties),
                  "topk_tile_scan: null pointer");
  if (ntiles == 0) return;
  tile_scan_kernel<<<1, 1024, 0, stream>>>(tile_above, tile_ties, ntiles);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_topk_compact(float* x, int64_t n, const TopkDeviceState* state,
                         const int64_t* tile_above, const int64_t* tile_ties,
                         uint32_t* indices, float* values, cudaStream_t stream) {
  TUTTI_ARG_CHECK(n >= 0, "topk_compact: negative n ", n);
  TUTTI_ARG_CHECK(state && tile_above && tile_ties && indices && values &&
                      (n == 0 || x),
                  "topk_compact: null pointer");
  if (n == 0) return;
  compact_kernel<<<static_cast<unsigned>(topk_tiles(n)), kTileThreads, 0,
                   stream>>>(x, n, state, tile_above, tile_ties, indices,
                             values);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_topk_scatter_add(const uint32_t* indices, const float* values,
                             int64_t k, float* out, cudaStream_t stream) {
  TUTTI_ARG_CHECK(k >= 0, "topk_scatter_add: negative k ", k);
  TUTTI_ARG_CHECK(k == 0 || (indices && values && out),
                  "topk_scatter_add: null pointer");
  if (k == 0) return;
  scatter_add_kernel<<<dev::grid_for(k), dev::kThreads, 0, stream>>>(
      indices, values, k, out);
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
