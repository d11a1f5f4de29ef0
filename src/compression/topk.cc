// Top-k sparsification with error feedback.  See topk.h for the scheme.
//
// Wire format per rank: one uint32 block of 2k words, [k indices | k value
// bits], all-gathered (every rank sends the same k, so a plain all-gather).
// Decoding adds rank 0's pairs, then rank 1's, ...: a fixed order, so every
// rank computes the same floating-point sums.  Indices are 32-bit: a bucket
// holds at most 2^31 - 1 elements.
#include "compression/topk.h"

#include <algorithm>
#include <array>
#include <functional>
#include <cmath>

#include "compression/topk_bins.h"
#include "core/check.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_topk.h"
#endif

namespace tutti {
namespace compression {

int64_t topk_count(int64_t n, double ratio) {
  if (n <= 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (k < 1) return 1;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<int64_t>(k);
}

namespace {

// Scans bins from the top; returns the bin where the running count reaches
// *remaining and moves the elements above it from *remaining to *above.
template <size_t N>
uint32_t pick_bin(const std::array<int64_t, N>& hist, int64_t* remaining,
                  int64_t* above) {
  int64_t before = 0;
  const int b = topk_find_bin(hist.data(), static_cast<int>(N) - 1,
                              static_cast<int>(N), 0, *remaining, &before);
  if (b >= 0) {
    *above += before;
    *remaining -= before;
    return static_cast<uint32_t>(b);
  }
  TUTTI_THROW(kInternal, "topk: histogram holds fewer than ", *remaining,
              " elements");
}

}  // namespace

namespace {

// Radix select over m keys given by key_at(i).
template <typename KeyAt>
TopkThreshold radix_threshold(KeyAt key_at, int64_t m, int64_t k,
                              std::vector<uint32_t>* keys) {
  TUTTI_CHECK(k >= 1 && k <= m, "topk: k = ", k, " for ", m, " elements");
  int64_t remaining = k, above = 0;
  // Level 0: bits 30..20 over every key.
  std::array<int64_t, 2048> h0{};
  for (int64_t i = 0; i < m; ++i) ++h0[key_at(i) >> 20];
  const uint32_t b0 = pick_bin(h0, &remaining, &above);
  // The keys in the chosen bin (usually a small fraction).
  keys->clear();
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t key = key_at(i);
    if ((key >> 20) == b0) keys->push_back(key);
  }
  // Levels 1 and 2: bits 19..10, then 9..0, over those keys.
  std::array<int64_t, 1024> h1{};
  for (uint32_t key : *keys) ++h1[(key >> 10) & 1023u];
  const uint32_t b1 = pick_bin(h1, &remaining, &above);
  const uint32_t high = (b0 << 10) | b1;
  std::array<int64_t, 1024> h2{};
  for (uint32_t key : *keys)
    if ((key >> 10) == high) ++h2[key & 1023u];
  const uint32_t b2 = pick_bin(h2, &remaining, &above);
  TopkThreshold t;
  t.key = (high << 10) | b2;
  t.above = above;
  t.ties = remaining;
  return t;
}

// Writes the pairs of the elements x[at(j)], j < m (at() ascending), that
// pass threshold t, and zeroes them.
template <typename At>
void emit(float* x, int64_t m, At at, const TopkThreshold& t,
          uint32_t* indices, float* values) {
  int64_t a = 0, e = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = at(j);
    const uint32_t key = topk_key(x[i]);
    if (key > t.key) {
      indices[a] = static_cast<uint32_t>(i);
      values[a] = x[i];
      x[i] = 0.0f;
      ++a;
    } else if (key == t.key && e < t.ties) {
      indices[t.above + e] = static_cast<uint32_t>(i);
      values[t.above + e] = x[i];
      x[i] = 0.0f;
      ++e;
    }
  }
  TUTTI_CHECK(a == t.above && e == t.ties, "topk: selected ", a, " + ", e,
              ", expected ", t.above, " + ", t.ties);
}

// A key at or below the k-th largest with high probability, from a strided
// sample: the sample's (2 s_k + 64)-th largest, s_k the sample rank of k.
uint32_t sampled_lower_bound(const float* x, int64_t n, int64_t k,
                             std::vector<uint32_t>* keys) {
  constexpr int64_t kSample = 16384;
  const int64_t stride = n / kSample;
  keys->clear();
  for (int64_t j = 0; j < kSample; ++j) keys->push_back(topk_key(x[j * stride]));
  const int64_t sk = k * kSample / n;
  const int64_t pos = std::min<int64_t>(kSample - 1, 2 * sk + 64);
  std::nth_element(keys->begin(), keys->begin() + pos, keys->end(),
                   std::greater<uint32_t>());
  return (*keys)[pos];
}

}  // namespace

TopkThreshold topk_threshold_cpu(const float* x, int64_t n, int64_t k,
                                 TopkScratch* scratch) {
  return radix_threshold([x](int64_t i) { return topk_key(x[i]); }, n, k,
                         &scratch->keys);
}

void topk_select_cpu(float* x, int64_t n, int64_t k, uint32_t* indices,
                     float* values, TopkScratch* scratch) {
  if (n >= (int64_t{1} << 16) && k * 8 <= n) {
    const uint32_t low = sampled_lower_bound(x, n, k, &scratch->keys);
    std::vector<uint32_t>& cand = scratch->candidates;
    cand.clear();
    for (int64_t i = 0; i < n; ++i)
      if (topk_key(x[i]) >= low) cand.push_back(static_cast<uint32_t>(i));
    const int64_t m = static_cast<int64_t>(cand.size());
    if (m >= k) {
      // Every element at or above the k-th largest key is a candidate, so
      // the threshold and the selection over the candidates are exact.
      const TopkThreshold t = radix_threshold(
          [&](int64_t j) { return topk_key(x[cand[j]]); }, m, k, &scratch->keys);
      emit(x, m, [&](int64_t j) { return static_cast<int64_t>(cand[j]); }, t,
           indices, values);
      return;
    }
  }
  const TopkThreshold t = topk_threshold_cpu(x, n, k, scratch);
  emit(x, n, [](int64_t i) { return i; }, t, indices, values);
}

void topk_scatter_add_cpu(const uint32_t* indices, const float* values,
                          int64_t k, float* out) {
  for (int64_t j = 0; j < k; ++j) out[indices[j]] += values[j];
}

namespace {

class TopkCompressor final : public BucketCompressor {
 public:
  explicit TopkCompressor(double ratio)
      : BucketCompressor("topk", "compressor/topk", /*floating_only=*/true),
        ratio_(ratio) {}

  Payload payload(int id, int64_t) const override {
    Payload p;
    p.allgather_bytes =
        static_cast<uint64_t>(topk_count(layout(id).numel, ratio_)) * 8;
    return p;
  }

 protected:
  struct State {
    int64_t k = 0;
    DeviceArray residual;  // float32[numel]
    GatherExchange pairs;  // uint32[2k] per rank: indices, then value bits
    DeviceArray acc;       // float32[numel] unless the bucket is float32
    DeviceArray workspace; // CUDA selection workspace
    TopkScratch scratch;
  };

  void on_setup(const BucketLayout& l) override {
    TUTTI_ARG_CHECK(l.numel <= 0x7fffffffLL, "topk compressor: bucket ", l.id,
                    " has ", l.numel,
                    " elements; 32-bit indices allow at most 2^31 - 1");
    State s;
    s.k = topk_count(l.numel, ratio_);
    s.residual = DeviceArray(l.device, static_cast<size_t>(l.numel) * 4);
    s.pairs = GatherExchange(l.device, 2 * s.k);
    if (l.dtype != DType::kFloat32)
      s.acc = DeviceArray(l.device, static_cast<size_t>(l.numel) * 4);
#if TUTTI_WITH_CUDA
    if (l.device.is_cuda())
      s.workspace = DeviceArray(
          l.device, 256 + kernels::kTopkHistBins * 4 +
                        static_cast<size_t>(kernels::topk_tiles(l.numel)) * 16);
#endif
    states_.emplace(l.id, std::move(s));
  }

  const DeviceArray* residual(int id) const override {
    return &states_.at(id).residual;
  }

  void run(int id, const Tensor& bucket, const CompressContext& ctx,
           PhaseClock& clock) override {
    State& s = states_.at(id);
    const Device dev = bucket.device();
    const int64_t n = bucket.numel(), k = s.k;
    const int world = ctx.comm->size();
    float* res = s.residual.as<float>();
    uint32_t* idx = s.pairs.send();
    float* val = reinterpret_cast<float*>(idx + k);

    accumulate_f32(dev, bucket.data(), bucket.dtype(), res, n, ctx.stream);
    select(dev, res, n, k, idx, val, &s, ctx.stream);
    clock.encode();

    const uint32_t* gathered =
        s.pairs.exchange(ctx.comm, op_options(id, "pairs", ctx));
    clock.comm();

    float* acc = bucket.dtype() == DType::kFloat32 ? bucket.data_as<float>()
                                                   : s.acc.as<float>();
    zero_bytes(dev, acc, static_cast<size_t>(n) * 4, ctx.stream);
    for (int r = 0; r < world; ++r) {
      const uint32_t* block = gathered + static_cast<int64_t>(r) * 2 * k;
      scatter_add(dev, block, reinterpret_cast<const float*>(block + k), k,
                  acc, ctx.stream);
    }
    store_f32(dev, acc, static_cast<float>(world), bucket.data(),
              bucket.dtype(), n, ctx.stream);
    clock.decode();
  }

 private:
  static void select(Device dev, float* x, int64_t n, int64_t k, uint32_t* idx,
                     float* val, State* s, void* stream) {
    if (dev.is_cpu()) return topk_select_cpu(x, n, k, idx, val, &s->scratch);
#if TUTTI_WITH_CUDA
    auto st = static_cast<cudaStream_t>(stream);
    char* ws = s->workspace.as<char>();
    auto* state = reinterpret_cast<kernels::TopkDeviceState*>(ws);
    auto* hist = reinterpret_cast<uint32_t*>(ws + 256);
    auto* tile_above = reinterpret_cast<int64_t*>(ws + 256 + kernels::kTopkHistBins * 4);
    const int64_t ntiles = kernels::topk_tiles(n);
    int64_t* tile_ties = tile_above + ntiles;
    for (int level = 0; level < 3; ++level) {
      kernels::launch_topk_histogram(x, n, level, state, hist, st);
      kernels::launch_topk_pick_bin(hist, level, k, state, st);
    }
    kernels::launch_topk_tile_count(x, n, state, tile_above, tile_ties, st);
    kernels::launch_topk_tile_scan(tile_above, tile_ties, ntiles, st);
    kernels::launch_topk_compact(x, n, state, tile_above, tile_ties, idx, val, st);
#endif
  }

  static void scatter_add(Device dev, const uint32_t* idx, const float* val,
                          int64_t k, float* out, void* stream) {
    if (dev.is_cpu()) return topk_scatter_add_cpu(idx, val, k, out);
#if TUTTI_WITH_CUDA
    kernels::launch_topk_scatter_add(idx, val, k, out,
                                     static_cast<cudaStream_t>(stream));
#endif
  }

  double ratio_;
  std::map<int, State> states_;
};

}  // namespace

std::shared_ptr<BucketCompressor> make_topk_compressor(double ratio) {
  TUTTI_ARG_CHECK(ratio > 0.0 && ratio <= 1.0, "topk compressor: ratio ",
                  ratio, " must be in (0, 1] (TUTTI_TOPK_RATIO)");
  return std::make_shared<TopkCompressor>(ratio);
}

}  // namespace compression
}  // namespace tutti
