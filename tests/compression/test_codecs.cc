// The CPU reference codecs against brute-force oracles (one process): top-k
// selection vs a full sort, 1-bit encode/decode vs the definition, PowerSGD's
// Gram-Schmidt and decompression, the cast conversion vs the scalar
// dtype reference, and the auto cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "compression/cast.h"
#include "compression/cost_model.h"
#include "compression/onebit.h"
#include "compression/powersgd.h"
#include "compression/topk.h"

namespace tutti {
namespace compression {
namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed, int ties = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  // Optionally many exact ties in magnitude (both signs) and zeros.
  for (int64_t i = 0; ties && i < n; i += 3) v[i] = (i % 2 ? 0.5f : -0.5f);
  for (int64_t i = 1; ties && i < n; i += 11) v[i] = 0.0f;
  return v;
}

// ---- top-k ---------------------------------------------------------------

TEST(TopkCodec, CountClampsToOneAndN) {
  EXPECT_EQ(topk_count(0, 0.01), 0);
  EXPECT_EQ(topk_count(1, 0.01), 1);
  EXPECT_EQ(topk_count(1000, 0.01), 10);
  EXPECT_EQ(topk_count(1001, 0.01), 11);
  EXPECT_EQ(topk_count(50, 1.0), 50);
}

// The selection equals a stable sort by (|x| descending, index ascending).
TEST(TopkCodec, SelectionMatchesFullSortOracleWithTies) {
  TopkScratch scratch;
  for (int64_t n : {1, 2, 7, 33, 1000, 4097, 100003}) {
    for (int ties : {0, 1}) {
      for (int64_t k : {int64_t{1}, std::max<int64_t>(1, n / 100), n / 2 + 1, n}) {
        if (k > n) continue;
        const std::vector<float> x0 = random_floats(n, 11 + n + k, ties);
        std::vector<float> x = x0;
        std::vector<uint32_t> idx(k, 0xdeadbeefu);
        std::vector<float> val(k, NAN);
        topk_select_cpu(x.data(), n, k, idx.data(), val.data(), &scratch);

        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return topk_key(x0[a]) > topk_key(x0[b]);
        });
        std::vector<uint32_t> want(order.begin(), order.begin() + k);
        std::vector<uint32_t> got = idx;
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got, want) << "n=" << n << " k=" << k << " ties=" << ties;
        // Output order: strictly-above elements by index, then ties by index.
        const uint32_t tkey = topk_key(x0[order[k - 1]]);
        int64_t above = 0;
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(val[j], x0[idx[j]]);
          if (topk_key(val[j]) > tkey) ++above;
        }
        for (int64_t j = 1; j < k; ++j)
          if (j != above) ASSERT_LT(idx[j - 1], idx[j]) << "order at " << j;
        // Error feedback: the selected are zeroed, everything else kept.
        std::vector<bool> sel(n, false);
        for (uint32_t i : idx) sel[i] = true;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(x[i], sel[i] ? 0.0f : x0[i]) << "residual at " << i;
      }
    }
  }
}

// The sampled pre-selection over-estimates the threshold when the large
// values sit exactly on the sample positions: the exact path must take over.
TEST(TopkCodec, SampledPreselectionFallsBackWhenTheSampleMisleads) {
  const int64_t n = 200000, stride = n / 16384, k = 20000;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = (i % stride == 0 ? 100.0f : 1.0f) + i * 1e-6f;
  std::vector<float> x0 = x;
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  TopkScratch scratch;
  topk_select_cpu(x.data(), n, k, idx.data(), val.data(), &scratch);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return topk_key(x0[a]) > topk_key(x0[b]); });
  std::vector<uint32_t> want(order.begin(), order.begin() + k), got = idx;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

TEST(TopkCodec, ThresholdCountsAboveAndTies) {
  std::vector<float> x = {1, -3, 2, 2, -2, 0, 5};
  TopkScratch scratch;
  const TopkThreshold t = topk_threshold_cpu(x.data(), 7, 3, &scratch);
  EXPECT_EQ(t.key, topk_key(2.0f));
  EXPECT_EQ(t.above, 2);  // 5, -3
  EXPECT_EQ(t.ties, 1);   // the first of 2, 2, -2
}

TEST(TopkCodec, NaNIsSelectedFirst) {
  std::vector<float> x = {1, NAN, 3, -INFINITY};
  std::vector<uint32_t> idx(2);
  TopkScratch scratch;
  std::vector<float> val(2);
  topk_select_cpu(x.data(), 4, 2, idx.data(), val.data(), &scratch);
  EXPECT_EQ(idx[0], 1u);
  EXPECT_EQ(idx[1], 3u);
}

TEST(TopkCodec, ScatterAddSums) {
  std::vector<float> out(5, 1.0f);
  const uint32_t idx[] = {4, 0};
  const float val[] = {2.5f, -1.0f};
  topk_scatter_add_cpu(idx, val, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.0f, 1, 1, 1, 3.5f}));
}

// ---- 1-bit ---------------------------------------------------------------

TEST(OnebitCodec, EncodeIsSignTimesChunkMeanAndKeepsTheRest) {
  for (int64_t n : {1, 31, 32, 33, 64, 100, 4096 + 7}) {
    for (int64_t chunk : {32, 64, 2048}) {
      const std::vector<float> x0 = random_floats(n, 5 + n, 1);
      std::vector<float> x = x0;
      std::vector<uint32_t> block(onebit_block_words(n, chunk), 0xffffffffu);
      onebit_encode_cpu(x.data(), n, chunk, block.data());
      const int64_t nchunks = onebit_chunks(n, chunk);
      for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t b = c * chunk, e = std::min(n, b + chunk);
        double s = 0;
        for (int64_t i = b; i < e; ++i) s += std::fabs(x0[i]);
        float scale;
        std::memcpy(&scale, &block[c], 4);
        ASSERT_NEAR(scale, s / (e - b), 1e-6 * (1 + s / (e - b)));
        for (int64_t i = b; i < e; ++i) {
          const bool bit = (block[nchunks + i / 32] >> (i % 32)) & 1u;
          ASSERT_EQ(bit, !(x0[i] < 0)) << "sign of " << i;
          const float sent = bit ? scale : -scale;
          ASSERT_EQ(x[i], x0[i] - sent) << "residual of " << i;
        }
      }
      // Bits past n in the last word are zero.
      if (n % 32) ASSERT_EQ(block.back() >> (n % 32), 0u);
    }
  }
}

TEST(OnebitCodec, DecodeSumsRanksInOrderAndDivides) {
  const int64_t n = 100, chunk = 64;
  const int world = 3;
  const int64_t bw = onebit_block_words(n, chunk);
  std::vector<uint32_t> blocks(world * bw);
  std::vector<std::vector<float>> sent(world);
  for (int r = 0; r < world; ++r) {
    std::vector<float> x = random_floats(n, 100 + r);
    const uint32_t* blk = blocks.data() + r * bw;
    onebit_encode_cpu(x.data(), n, chunk, blocks.data() + r * bw);
    sent[r].resize(n);
    for (int64_t i = 0; i < n; ++i) {  // the definition: +-scale by sign bit
      float scale;
      std::memcpy(&scale, blk + i / chunk, 4);
      const bool bit = (blk[onebit_chunks(n, chunk) + i / 32] >> (i % 32)) & 1u;
      sent[r][i] = bit ? scale : -scale;
    }
  }
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16}) {
    std::vector<unsigned char> out(n * dtype_size(dt));
    onebit_decode_sum_cpu(blocks.data(), world, n, chunk, 3.0f, out.data(), dt);
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (int r = 0; r < world; ++r) s += sent[r][i];
      unsigned char want[8];
      store_from_double(want, dt, 0, s / 3.0f);
      ASSERT_EQ(load_as_double(out.data(), dt, i), load_as_double(want, dt, 0))
          << dtype_name(dt) << " element " << i;
    }
  }
}

// ---- PowerSGD ------------------------------------------------------------

// Largest |P^T P - I| entry of a row-major m x r matrix.
double orthonormality_error(const std::vector<float>& p, int64_t m, int64_t r) {
  double worst = 0;
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < r; ++b) {
      double d = 0;
      for (int64_t i = 0; i < m; ++i) d += double(p[i * r + a]) * p[i * r + b];
      worst = std::max(worst, std::fabs(d - (a == b ? 1.0 : 0.0)));
    }
  return worst;
}

TEST(PowerSgdCodec, OrthogonalizeGivesOrthonormalColumns) {
  for (int64_t m : {4, 9, 300}) {
    for (int64_t r : {1, 2, 4}) {
      if (r > m) continue;
      std::vector<float> p = random_floats(m * r, m * 10 + r);
      powersgd_orthogonalize_cpu(p.data(), m, r, 1, 2);
      ASSERT_LT(orthonormality_error(p, m, r), 1e-5) << "m=" << m << " r=" << r;
    }
  }
}

TEST(PowerSgdCodec, ZeroAndDependentColumnsAreReseededDeterministically) {
  const int64_t m = 50, r = 3;
  std::vector<float> p(m * r, 0.0f);
  for (int64_t i = 0; i < m; ++i) p[i * r + 1] = 2.0f;  // col 1: nonzero
  std::vector<float> q = p;
  powersgd_orthogonalize_cpu(p.data(), m, r, 9, 4);
  powersgd_orthogonalize_cpu(q.data(), m, r, 9, 4);
  EXPECT_EQ(p, q) << "deterministic";
  for (int64_t j = 0; j < r; ++j) {
    double s = 0;
    for (int64_t i = 0; i < m; ++i) s += double(p[i * r + j]) * p[i * r + j];
    EXPECT_NEAR(s, 1.0, 1e-5) << "column " << j << " has unit norm";
  }
  // Columns that are all multiples of one vector (a rank-1 gradient): one
  // projection pass would leave rounding noise that is far from orthogonal.
  const int64_t mm = 200, rr = 4;
  std::vector<float> dep(mm * rr);
  for (int64_t i = 0; i < mm; ++i)
    for (int64_t j = 0; j < rr; ++j) dep[i * rr + j] = std::sin(0.1f * i) * (j + 1.5f);
  powersgd_orthogonalize_cpu(dep.data(), mm, rr, 1, 1);
  EXPECT_LT(orthonormality_error(dep, mm, rr), 1e-6);
  // A matrix of rank 1 asked for 2 columns when m == 1: the second is zero.
  std::vector<float> tiny = {3.0f, 0.0f};
  powersgd_orthogonalize_cpu(tiny.data(), 1, 2, 0, 0);
  EXPECT_EQ(tiny[0], 1.0f);
  EXPECT_EQ(tiny[1], 0.0f);
}

TEST(PowerSgdCodec, DecompressIsPQtAndUpdatesResidual) {
  const int64_t m = 7, n = 1500, r = 3;  // n spans two column blocks
  const std::vector<float> p = random_floats(m * r, 1), q = random_floats(n * r, 2);
  std::vector<float> res = random_floats(m * n, 3), res0 = res;
  std::vector<float> qt(n * r);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    res = res0;
    std::vector<unsigned char> grad(m * n * dtype_size(dt));
    powersgd_decompress_cpu(p.data(), q.data(), m, n, r, res.data(), grad.data(), dt, qt.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float a = 0;
        for (int64_t k = 0; k < r; ++k) a = a + p[i * r + k] * q[j * r + k];
        ASSERT_EQ(res[i * n + j], res0[i * n + j] - a);
        unsigned char want[8];
        store_from_double(want, dt, 0, a);
        ASSERT_EQ(load_as_double(grad.data(), dt, i * n + j), load_as_double(want, dt, 0));
      }
  }
}

TEST(PowerSgdCodec, InitialQIsDeterministicAndBounded) {
  std::vector<float> a(1000), b(1000), c(1000);
  powersgd_initial_q(a.data(), 1000, 3, 7);
  powersgd_initial_q(b.data(), 1000, 3, 7);
  powersgd_initial_q(c.data(), 1000, 3, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0;
  for (float x : a) {
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 1.0f);
    mean += x / 1000;
  }
  EXPECT_NEAR(mean, 0.0, 0.1);
}

// ---- cast ----------------------------------------------------------------

TEST(CastCodec, ConvertMatchesScalarReference) {
  std::vector<float> x = random_floats(3000, 8);
  x[0] = 65504.0f * 4;  // overflows float16 unless divided by 4
  x[1] = 1e-8f;         // subnormal in float16
  x[2] = NAN;
  for (DType wire : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> w(x.size());
    cast_convert_cpu(x.data(), DType::kFloat32, w.data(), wire, x.size(), 4.0f);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = wire == DType::kFloat16 ? float_to_half(x[i] / 4.0f)
                                                    : float_to_bfloat16(x[i] / 4.0f);
      ASSERT_EQ(w[i], want) << dtype_name(wire) << " element " << i;
    }
    std::vector<double> back(x.size());
    cast_convert_cpu(w.data(), wire, back.data(), DType::kFloat64, x.size(), 1.0f);
    EXPECT_TRUE(std::isfinite(back[0])) << "pre-division avoided the overflow";
    if (wire == DType::kFloat16) EXPECT_EQ(back[0], 65504.0);
    EXPECT_TRUE(std::isnan(back[2]));
  }
}

// ---- auto's cost model -----------------------------------------------------

TEST(CostModel, FitsLatencyAndBandwidth) {
  const LinkModel m = fit_link(1024, 1e-4, 1024 + 1e8, 1e-4 + 1.0);
  EXPECT_NEAR(m.seconds_per_byte, 1e-8, 1e-15);
  EXPECT_NEAR(m.latency_s, 1e-4 - 1024e-8, 1e-12);
  EXPECT_NEAR(m.seconds(5e7), m.latency_s + 0.5, 1e-9);
  const LinkModel flat = fit_link(1024, 2e-4, 4096, 1e-4);  // noise
  EXPECT_EQ(flat.seconds_per_byte, 0.0);
  EXPECT_EQ(flat.latency_s, 2e-4);
}

TEST(CostModel, PicksByPredictedTimeWithMargin) {
  AutoCandidates c;
  c.bucket_bytes = 100e6;
  c.cast_possible = true;
  c.cast_bytes = 50e6;
  c.cast_compute_s = 0.01;
  c.psgd_possible = true;
  c.psgd_p_bytes = 1e6;
  c.psgd_q_bytes = 2e6;
  c.psgd_compute_s = 0.05;
  // 1 Gbit/s: communication dominates -> PowerSGD.
  LinkModel slow{50e-6, 8.0 / 1e9};
  AutoDecision d = decide(slow, c, 0.1);
  EXPECT_EQ(d.choice, AutoChoice::kPowerSgd);
  EXPECT_NEAR(d.t_none, 0.8 + 50e-6, 1e-9);
  // A fast link: PowerSGD's arithmetic costs more than it saves; fp16
  // still pays.
  LinkModel fast{5e-6, 8.0 / 400e9};
  d = decide(fast, c, 0.1);
  EXPECT_EQ(d.choice, AutoChoice::kNone) << d.t_none << " " << d.t_cast << " " << d.t_psgd;
  LinkModel mid{5e-6, 8.0 / 25e9};
  EXPECT_EQ(decide(mid, c, 0.1).choice, AutoChoice::kCast);
  // Less than the margin is not worth the loss of accuracy.
  AutoCandidates marginal = c;
  marginal.psgd_possible = false;
  marginal.cast_compute_s = 0.95 * slow.seconds(100e6) - slow.seconds(50e6);
  EXPECT_EQ(decide(slow, marginal, 0.1).choice, AutoChoice::kNone);
  // 16-bit gradients: no cast candidate.
  marginal.cast_possible = false;
  EXPECT_EQ(decide(slow, marginal, 0.1).choice, AutoChoice::kNone);
}

}  // namespace
}  // namespace compression
}  // namespace tutti
