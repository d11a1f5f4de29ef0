// Top-k sparsification with error feedback (Deep Gradient Compression, Lin
// et al. 2018, without momentum correction): each rank adds its residual to
// the gradient, sends the k largest magnitudes as (index, value) pairs by
// all-gather, keeps the rest as the next residual; every rank sums all
// ranks' pairs in rank order, so the average is bit-identical everywhere.
#pragma once

#include <memory>
#include <vector>

#include "compression/common.h"

namespace tutti {
namespace compression {

// Elements sent per rank for a bucket of n elements: ceil(ratio * n),
// clamped to [1, n] (0 for an empty bucket).
int64_t topk_count(int64_t n, double ratio);

// Selection key of x: |x| as an unsigned integer (IEEE bits without the
// sign), so integer order is magnitude order; NaN sorts above infinity.
inline uint32_t topk_key(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  return u & 0x7fffffffu;
}

// Where the k-th largest key lies: elements with key > `key` (`above` of
// them) are all taken, then the first `ties` elements with key == `key` in
// index order (above + ties == k).
struct TopkThreshold {
  uint32_t key = 0;
  int64_t above = 0;
  int64_t ties = 0;
};

// Reused between calls so the hot path does not allocate once warm.
struct TopkScratch {
  std::vector<uint32_t> keys;        // radix candidates
  std::vector<uint32_t> candidates;  // sampled pre-selection (indices)
};

// CPU reference of the threshold: radix select on the key, an 11-bit
// histogram over all elements, then 10 + 10 bits over the candidates in the
// chosen bin; no sort.
TopkThreshold topk_threshold_cpu(const float* x, int64_t n, int64_t k,
                                 TopkScratch* scratch);

// Selects the top-k of x (ties to the lowest index), writes their indices
// and values -- the elements above the threshold in index order, then the
// tied ones in index order -- and zeroes them in x, which becomes the new
// residual.  k in [1, n].  Large inputs with a small k first estimate a
// lower bound of the threshold from a strided sample and keep the elements
// at or above it (one pass); the exact radix select and the selection then
// run on those candidates only.  When the sample under-estimates (fewer
// than k candidates) the full two-pass radix path runs instead; both paths
// give exactly the same output.
void topk_select_cpu(float* x, int64_t n, int64_t k, uint32_t* indices,
                     float* values, TopkScratch* scratch);

// out[indices[j]] += values[j] for one rank's pairs (indices distinct).
void topk_scatter_add_cpu(const uint32_t* indices, const float* values,
                          int64_t k, float* out);

// ratio in (0, 1].
std::shared_ptr<BucketCompressor> make_topk_compressor(double ratio);

}  // namespace compression
}  // namespace tutti
