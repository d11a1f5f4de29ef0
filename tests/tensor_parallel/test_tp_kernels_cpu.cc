// CPU checks of what the tensor-parallel GPU paths rely on: the cache that
// gives every (device, stream) its own cuBLAS workspace and reduction
// scratch, the float32 accumulation of the vocab-parallel embedding
// gradient (the CPU twin the GPU kernel is compared with), and the batched
// sum of squares behind tp_grad_norm_squared.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/stream_cache.h"
#include "tensor_parallel/cpu_kernels.h"
#include "tensor_parallel/ops.h"

namespace tutti {
namespace {

TEST(StreamCache, OneEntryPerDeviceAndStream) {
  StreamCache<int> cache;
  int made = 0;
  auto make = [&] { return std::make_unique<int>(++made); };
  int s1 = 0, s2 = 0;  // addresses stand in for cudaStream_t values
  auto& a = cache.get(0, &s1, make);
  auto& b = cache.get(0, &s2, make);
  auto& c = cache.get(1, &s1, make);
  auto& d = cache.get(0, nullptr, make);  // the default stream is a key too
  EXPECT_EQ(*a.value, 1);
  EXPECT_EQ(*b.value, 2);
  EXPECT_EQ(*c.value, 3);
  EXPECT_EQ(*d.value, 4);
  EXPECT_EQ(&cache.get(0, &s1, make), &a) << "same key, same entry";
  EXPECT_EQ(&cache.get(1, &s1, make), &c);
  EXPECT_EQ(made, 4);
  EXPECT_EQ(cache.size(), 4u);
}

TEST(StreamCache, AFailedBuildIsRetried) {
  StreamCache<int> cache;
  int stream = 0;
  EXPECT_THROW(cache.get(0, &stream,
                         []() -> std::unique_ptr<int> {
                           throw std::runtime_error("no memory");
                         }),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(*cache.get(0, &stream, [] { return std::make_unique<int>(7); }).value, 7);
}

TEST(StreamCache, ReleasedValuesAreFreedAndBuiltAgainOnTheNextGet) {
  StreamCache<int> cache;
  int made = 0;
  auto make = [&] { return std::make_unique<int>(++made); };
  int s1 = 0, s2 = 0;
  auto& a = cache.get(0, &s1, make);
  cache.get(0, &s2, make);
  release_stream_caches();  // what tutti::shutdown() calls
  EXPECT_EQ(a.value, nullptr) << "the value is freed, the entry stays";
  EXPECT_EQ(cache.size(), 2u);
  auto& again = cache.get(0, &s1, make);
  EXPECT_EQ(&again, &a) << "same entry after the release";
  ASSERT_NE(again.value, nullptr);
  EXPECT_EQ(*again.value, 3) << "built anew";
  {
    StreamCache<int> gone;  // unregisters when destroyed
    gone.get(0, &s1, make);
  }
  release_stream_caches();  // must not touch the destroyed cache
  EXPECT_EQ(a.value, nullptr);
}

TEST(StreamCache, ConcurrentGetsBuildEachEntryOnce) {
  StreamCache<int> cache;
  std::atomic<int> made{0};
  int streams[4];
  std::vector<std::thread> threads;
  std::vector<const void*> seen(8 * 4);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int s = 0; s < 4; ++s) {
        auto& e = cache.get(s % 2, &streams[s], [&] {
          return std::make_unique<int>(made.fetch_add(1));
        });
        std::lock_guard<std::mutex> lock(e.mu);  // how callers use an entry
        seen[t * 4 + s] = &e;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(made.load(), 4);
  for (int t = 1; t < 8; ++t)
    for (int s = 0; s < 4; ++s) EXPECT_EQ(seen[t * 4 + s], seen[s]);
}

std::vector<unsigned char> bytes_of(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> b(v.size() * dtype_size(dt));
  convert(v.data(), DType::kFloat32, b.data(), dt, v.size());
  return b;
}

// 4096 copies of one token with gradient 1 (plus two other tokens): the
// float32 sum is 4096 (exact in float16 and bfloat16).  Summing in the table's own precision stalls at
// 2048 (float16: 2048 + 1 rounds to 2048) or 256 (bfloat16).
TEST(EmbeddingGrad, RepeatedTokensAreSummedInFloat32) {
  const int64_t n = 4098, dim = 3, rows = 5, start = 10;
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<int64_t> ids(n, start + 2);
    ids[7] = start + 4;  // one other held row
    ids[8] = 3;          // not held
    std::vector<float> dy(n * dim, 1.0f);
    for (int64_t h = 0; h < dim; ++h) dy[7 * dim + h] = 0.25f;
    auto dyb = bytes_of(dy, dt);
    auto dw = bytes_of(std::vector<float>(rows * dim, 0.0f), dt);
    std::vector<float> acc(rows * dim, -1.0f);  // overwritten
    tp::cpu::embedding_grad(ids.data(), DType::kInt64, dyb.data(), dt, n, dim,
                            start, rows, dw.data(), acc.data());
    std::vector<float> got(rows * dim);
    convert(dw.data(), dt, got.data(), DType::kFloat32, got.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < dim; ++h) {
        const float want = r == 2 ? static_cast<float>(n - 2) : r == 4 ? 0.25f : 0.0f;
        EXPECT_EQ(got[r * dim + h], want) << "row " << r;
      }
    // Accumulating onto an existing gradient rounds once: 0.5 + 4096.
    auto dw2 = bytes_of(std::vector<float>(rows * dim, 0.5f), dt);
    tp::cpu::embedding_grad(ids.data(), DType::kInt64, dyb.data(), dt, n, dim,
                            start, rows, dw2.data(), acc.data());
    convert(dw2.data(), dt, got.data(), DType::kFloat32, got.size());
    std::vector<float> want = {4096.5f};
    auto rounded = bytes_of(want, dt);
    convert(rounded.data(), dt, want.data(), DType::kFloat32, 1);
    EXPECT_EQ(got[2 * dim], want[0]);
    EXPECT_EQ(got[0], 0.5f) << "rows without tokens are untouched";
  }
}

TEST(EmbeddingGrad, HalfPrecisionNeedsTheAccumulator) {
  std::vector<int64_t> ids = {0};
  auto dy = bytes_of({1.0f}, DType::kFloat16), dw = bytes_of({0.0f}, DType::kFloat16);
  EXPECT_THROW(tp::cpu::embedding_grad(ids.data(), DType::kInt64, dy.data(),
                                       DType::kFloat16, 1, 1, 0, 1, dw.data(), nullptr),
               Error);
  Tensor tid(ids.data(), DType::kInt64, Shape{1});
  Tensor tdy(dy.data(), DType::kFloat16, Shape{1, 1});
  Tensor tdw(dw.data(), DType::kFloat16, Shape{1, 1});
  EXPECT_THROW(tp::embedding_grad(tid, tdy, 0, tdw, Tensor(), nullptr), Error);
}

TEST(SumSquares, BatchedMatchesClosedForm) {
  // x_t = [1, 2, ..., n_t]: sum of squares n(n+1)(2n+1)/6, exact in float64.
  std::vector<std::vector<float>> data;
  std::vector<Tensor> xs;
  for (int64_t n : {0, 1, 7, 1000}) {
    data.emplace_back(n);
    for (int64_t i = 0; i < n; ++i) data.back()[i] = static_cast<float>(i + 1);
  }
  for (auto& d : data)
    xs.emplace_back(d.data(), DType::kFloat32, Shape{static_cast<int64_t>(d.size())});
  std::vector<double> out(xs.size(), -1.0);
  tp::sum_squares(xs, out.data(), nullptr);
  for (size_t t = 0; t < xs.size(); ++t) {
    const double n = static_cast<double>(data[t].size());
    EXPECT_EQ(out[t], n * (n + 1) * (2 * n + 1) / 6) << "tensor " << t;
  }
  tp::sum_squares({}, nullptr, nullptr);  // nothing to do
}

}  // namespace
}  // namespace tutti
