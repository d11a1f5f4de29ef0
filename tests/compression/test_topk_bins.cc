// CPU checks of logic the CUDA kernels share with the CPU references:
// the top-k bin selection as the parallel pick_bin scan runs it (chunks of
// bins per thread, an exclusive scan of the chunk totals), and the
// non-finite check behind the error-feedback overflow agreement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/common.h"
#include "compression/topk_bins.h"

namespace tutti {
namespace compression {
namespace {

// The reference: one chunk covering every bin (what the CPU select runs).
int serial_pick(const std::vector<uint32_t>& h, int64_t remaining,
                int64_t* before) {
  return topk_find_bin(h.data(), static_cast<int>(h.size()) - 1,
                       static_cast<int>(h.size()), 0, remaining, before);
}

// The chosen bin b must satisfy before < remaining <= before + h[b], with
// `before` the count of the bins above b: checked from scratch.
void expect_valid(const std::vector<uint32_t>& h, int64_t remaining, int b,
                  int64_t before) {
  ASSERT_GE(b, 0);
  int64_t above = 0;
  for (size_t i = h.size(); i-- > static_cast<size_t>(b) + 1;) above += h[i];
  EXPECT_EQ(before, above);
  EXPECT_LT(before, remaining);
  EXPECT_GE(before + h[b], remaining);
}

void expect_chunked_equals_serial(const std::vector<uint32_t>& h,
                                  int64_t remaining, const char* what) {
  SCOPED_TRACE(::testing::Message() << what << " remaining=" << remaining
                                    << " bins=" << h.size());
  int64_t b_serial = 0, b_chunked = 0;
  const int s = serial_pick(h, remaining, &b_serial);
  expect_valid(h, remaining, s, b_serial);
  // The kernel's geometry (1024 threads) and a few others.
  for (int threads : {1024, 256, 32, 1}) {
    const int c = topk_find_bin_chunked(h.data(), static_cast<int>(h.size()),
                                        threads, remaining, &b_chunked);
    EXPECT_EQ(c, s) << threads << " threads";
    EXPECT_EQ(b_chunked, b_serial) << threads << " threads";
  }
}

TEST(TopkBins, ChunkedScanPicksTheSerialBinOnRandomHistograms) {
  std::mt19937_64 rng(42);
  for (int bins : {2048, 1024})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<uint32_t> h(bins);
      const bool sparse = trial % 2 == 0;
      for (auto& x : h) x = sparse ? (rng() % 16 == 0 ? rng() % 50 : 0) : rng() % 7;
      int64_t total = 0;
      for (auto x : h) total += x;
      if (total == 0) h[rng() % bins] = 3, total = 3;
      for (int64_t remaining :
           {int64_t{1}, total, total / 2 + 1, 1 + int64_t(rng() % total)})
        expect_chunked_equals_serial(h, remaining, sparse ? "sparse" : "dense");
    }
}

// remaining equal to the running count exactly at a chunk edge (the last
// bin of one thread's chunk) and one past it (the first non-empty bin of a
// later chunk), with empty bins between: ties of the running count.
TEST(TopkBins, ChunkEdgesAndEmptyRunsPickTheSerialBin) {
  for (int bins : {2048, 1024}) {
    std::vector<uint32_t> h(bins, 0);
    const int per = bins / 1024;
    // Non-empty bins only at chunk edges, from the top.
    for (int b = bins - 1; b >= 0; b -= 37 * per) h[b] = 5;
    h[per - 1] = 9;  // the last chunk's top bin
    int64_t total = 0;
    for (auto x : h) total += x;
    int64_t running = 0;
    for (int b = bins - 1; b >= 0; --b) {
      if (h[b] == 0) continue;
      running += h[b];
      expect_chunked_equals_serial(h, running, "ends on the bin");
      expect_chunked_equals_serial(h, running - 1, "inside the bin");
      if (running < total)
        expect_chunked_equals_serial(h, running + 1, "the next non-empty bin");
    }
    // All elements tied in one bin.
    std::vector<uint32_t> one(bins, 0);
    one[bins / 2] = 1000;
    for (int64_t remaining : {1, 500, 1000})
      expect_chunked_equals_serial(one, remaining, "one bin");
  }
}

TEST(TopkBins, TooFewElementsFindsNoBin) {
  std::vector<uint32_t> h(1024, 0);
  h[3] = 2;
  int64_t before = -1;
  EXPECT_EQ(serial_pick(h, 3, &before), -1);
  EXPECT_EQ(topk_find_bin_chunked(h.data(), 1024, 1024, 3, &before), -1);
}

TEST(NonfiniteFlag, CpuCheckFindsInfAndNanInEveryDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                   DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    // The largest finite values of each dtype stay finite.
    const float big = dt == DType::kFloat16 ? 65504.0f : 3.0e38f;
    for (float bad : {0.0f, inf, -inf, std::nanf("")}) {
      std::vector<float> v = {1.0f, -big, big, 0.0f, -0.0f};
      if (bad != 0.0f || std::isnan(bad)) v[2] = bad;
      std::vector<unsigned char> b(v.size() * dtype_size(dt));
      convert(v.data(), DType::kFloat32, b.data(), dt, v.size());
      const bool want = !std::isfinite(v[2]);
      EXPECT_EQ(cpu::any_nonfinite(b.data(), dt, static_cast<int64_t>(v.size())), want)
          << "value " << bad;
      int32_t flag = -1;
      nonfinite_flag(Device::cpu(), b.data(), dt, static_cast<int64_t>(v.size()),
                     &flag, nullptr);
      EXPECT_EQ(flag, want ? 1 : 0);
    }
    EXPECT_FALSE(cpu::any_nonfinite(nullptr, dt, 0));
  }
}

}  // namespace
}  // namespace compression
}  // namespace tutti
