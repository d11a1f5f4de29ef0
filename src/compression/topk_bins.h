// The bin selection of one radix-select level, shared by the CPU reference
// (compression::topk_threshold_cpu) and the parallel CUDA scan
// (kernels/compression_topk.cu), so both pick the same bin by construction.
//
// Bins are scanned from the top (largest keys) down.  The chosen bin is the
// first whose running count reaches `remaining`: with `before` the elements
// in the bins above it, before < remaining <= before + hist[b].  The CPU
// scans all bins as one chunk; the GPU gives each thread a chunk of
// consecutive bins (from the top), an exclusive scan of the chunk totals
// gives each chunk's `before`, and exactly one thread finds the bin in its
// chunk.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TUTTI_TOPK_HD __host__ __device__ __forceinline__
#else
#define TUTTI_TOPK_HD inline
#endif

namespace tutti {
namespace compression {

// Scans bins top, top - 1, ..., top - count + 1, the first of which has
// `before` elements above it.  Returns the chosen bin and sets
// *before_bin to the elements above it, or returns -1 when the chosen bin
// is not in this chunk.  remaining >= 1.
template <typename H>
TUTTI_TOPK_HD int topk_find_bin(const H* hist, int top, int count,
                                int64_t before, int64_t remaining,
                                int64_t* before_bin) {
  for (int q = 0; q < count; ++q) {
    const int64_t h = static_cast<int64_t>(hist[top - q]);
    if (before < remaining && before + h >= remaining) {
      *before_bin = before;
      return top - q;
    }
    before += h;
  }
  return -1;
}

// Host model of the GPU scan: `threads` chunks of bins / threads bins each
// (bins a multiple of threads).  Returns the chosen bin (or -1 if the
// histogram holds fewer than `remaining`), *before_bin as above.  Tests
// compare it with the one-chunk scan.
template <typename H>
int topk_find_bin_chunked(const H* hist, int bins, int threads,
                          int64_t remaining, int64_t* before_bin) {
  const int per = bins / threads;
  int64_t before = 0;  // exclusive scan of the chunk totals, in chunk order
  int found = -1;
  for (int t = 0; t < threads; ++t) {
    const int top = bins - 1 - t * per;
    const int b = topk_find_bin(hist, top, per, before, remaining, before_bin);
    if (b >= 0) {
      if (found >= 0) return -2;  // two chunks claimed it: a broken invariant
      found = b;
    }
    for (int q = 0; q < per; ++q) before += static_cast<int64_t>(hist[top - q]);
  }
  return found;
}

}  // namespace compression
}  // namespace tutti
