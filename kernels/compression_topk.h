// CUDA twins of top-k selection and decoding (CPU references:
// compression::topk_threshold_cpu / topk_select_cpu / topk_scatter_add_cpu
// in src/compression/topk.h).  The selection is a radix select on the
// magnitude key in three levels (11 + 10 + 10 bits: histogram, pick the bin
// holding the k-th largest), then an order-preserving compaction in tiles,
// so the output -- elements above the threshold in index order, then the
// first ties in index order -- equals the CPU reference exactly.
#pragma once

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tutti {
namespace kernels {

// The selection's progress, in device memory.
struct TopkDeviceState {
  uint32_t prefix;    // key bits fixed so far (the threshold after level 2)
  uint32_t pad;
  int64_t remaining;  // of k, still to place at or below the prefix
  int64_t above;      // elements strictly above the threshold
};

constexpr int kTopkHistBins = 2048;
constexpr int64_t kTopkTile = 4096;  // elements per compaction tile
inline int64_t topk_tiles(int64_t n) { return (n + kTopkTile - 1) / kTopkTile; }

// hist (kTopkHistBins uint32) := histogram of level `level` (0, 1, 2) of the
// keys of x that match state->prefix on the higher levels (level 0: all).
void launch_topk_histogram(const float* x, int64_t n, int level,
                           const TopkDeviceState* state, uint32_t* hist,
                           cudaStream_t stream);
// Picks the bin of level `level` holding the k-th largest key and updates
// state (level 0 initialises it from k).
void launch_topk_pick_bin(const uint32_t* hist, int level, int64_t k,
                          TopkDeviceState* state, cudaStream_t stream);
// Per tile of kTopkTile elements: how many keys are above / equal to the
// threshold.
void launch_topk_tile_count(const float* x, int64_t n,
                            const TopkDeviceState* state, int64_t* tile_above,
                            int64_t* tile_ties, cudaStream_t stream);
// In place exclusive prefix sums of both per-tile arrays.
void launch_topk_tile_scan(int64_t* tile_above, int64_t* tile_ties,
                           int64_t ntiles, cudaStream_t stream);
// Writes the selected (index, value) pairs in CPU-reference order and zeroes
// them in x.
void launch_topk_compact(float* x, int64_t n, const TopkDeviceState* state,
                         const int64_t* tile_above, const int64_t* tile_ties,
                         uint32_t* indices, float* values, cudaStream_t stream);
// out[indices[j]] += values[j], j < k (indices distinct).
void launch_topk_scatter_add(const uint32_t* indices, const float* values,
                             int64_t k, float* out, cudaStream_t stream);

}  // namespace kernels
}  // namespace tutti
#endif  // TUTTI_WITH_CUDA
