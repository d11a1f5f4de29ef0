#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu_reduce.h"

namespace tutti {
namespace {

TEST(CpuReduce, FloatOps) {
  std::vector<float> a = {1, 2, -3, 4}, b = {5, -6, 7, 0.5f};
  auto s = b;
  reduce_inplace(DType::kFloat32, ReduceOp::kSum, a.data(), s.data(), 4);
  EXPECT_EQ(s, (std::vector<float>{6, -4, 4, 4.5f}));
  auto p = b;
  reduce_inplace(DType::kFloat32, ReduceOp::kProd, a.data(), p.data(), 4);
  EXPECT_EQ(p, (std::vector<float>{5, -12, -21, 2}));
  auto mn = b, mx = b;
  reduce_inplace(DType::kFloat32, ReduceOp::kMin, a.data(), mn.data(), 4);
  reduce_inplace(DType::kFloat32, ReduceOp::kMax, a.data(), mx.data(), 4);
  EXPECT_EQ(mn, (std::vector<float>{1, -6, -3, 0.5f}));
  EXPECT_EQ(mx, (std::vector<float>{5, 2, 7, 4}));
}

TEST(CpuReduce, MinMaxPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {nan, 1}, b = {2, nan};
  reduce_inplace(DType::kFloat32, ReduceOp::kMin, a.data(), b.data(), 2);
  EXPECT_TRUE(std::isnan(b[0]));
  EXPECT_TRUE(std::isnan(b[1]));
}

TEST(CpuReduce, HalfSumIsCorrectlyRounded) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-100, 100);
  const size_t n = 5000;
  std::vector<uint16_t> a(n), b(n), expect(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = float_to_half(d(rng));
    b[i] = float_to_half(d(rng) * 0.001f);
    // Exact sum in double, rounded once.
    const double s = static_cast<double>(half_to_float(a[i])) + half_to_float(b[i]);
    convert(&s, DType::kFloat64, &expect[i], DType::kFloat16, 1);
  }
  reduce_inplace(DType::kFloat16, ReduceOp::kSum, a.data(), b.data(), n);
  EXPECT_EQ(b, expect);
}

TEST(CpuReduce, IntegersWrapAndDivideTruncates) {
  std::vector<int8_t> a = {100, -100, 7}, b = {100, -100, -8};
  reduce_inplace(DType::kInt8, ReduceOp::kSum, a.data(), b.data(), 3);
  EXPECT_EQ(b[0], static_cast<int8_t>(-56));
  EXPECT_EQ(b[1], static_cast<int8_t>(56));
  EXPECT_EQ(b[2], -1);
  std::vector<int32_t> c = {7, -7, 6};
  divide_inplace(DType::kInt32, c.data(), 3, 2);
  EXPECT_EQ(c, (std::vector<int32_t>{3, -3, 3}));
  std::vector<uint16_t> h = {float_to_half(3.0f)};
  divide_inplace(DType::kFloat16, h.data(), 1, 3);
  EXPECT_EQ(h[0], float_to_half(1.0f));
}

}  // namespace
}  // namespace tutti
