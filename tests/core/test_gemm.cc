#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/gemm.h"
#include "tutti/tutti.h"

namespace tutti {
namespace {

// C = op(A) op(B) against a triple loop in double, for every transpose mix.
TEST(Gemm, MatchesReferenceAllTransposes) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  const int64_t m = 7, n = 5, k = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> a(m * k), b(k * n), c(m * n, 3.0f);
      for (auto& x : a) x = d(rng);
      for (auto& x : b) x = d(rng);
      Tensor A(a.data(), DType::kFloat32, ta ? Shape{k, m} : Shape{m, k});
      Tensor B(b.data(), DType::kFloat32, tb ? Shape{n, k} : Shape{k, n});
      Tensor C(c.data(), DType::kFloat32, Shape{m, n});
      blas::gemm(A, ta, B, tb, C, 2.0f, 0.5f);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double av = ta ? a[p * m + i] : a[i * k + p];
            const double bv = tb ? b[j * k + p] : b[p * n + j];
            s += av * bv;
          }
          EXPECT_NEAR(c[i * n + j], 2.0 * s + 1.5, 1e-5) << ta << tb << i << j;
        }
    }
}

TEST(Gemm, HalfAndShapeErrors) {
  std::vector<uint16_t> a(4), b(4), c(4);
  for (int i = 0; i < 4; ++i) {
    a[i] = float_to_half(static_cast<float>(i + 1));
    b[i] = float_to_half(i == 0 || i == 3 ? 1.0f : 0.0f);  // identity
  }
  Tensor A(a.data(), DType::kFloat16, Shape{2, 2});
  Tensor B(b.data(), DType::kFloat16, Shape{2, 2});
  Tensor C(c.data(), DType::kFloat16, Shape{2, 2});
  blas::gemm(A, false, B, false, C);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(half_to_float(c[i]), i + 1.0f);
  Tensor bad(c.data(), DType::kFloat16, Shape{4, 1});
  EXPECT_THROW(blas::gemm(A, false, B, false, bad), Error);
  std::vector<float> z(2 * 3, 1.0f), e(2 * 0), f(0);
  Tensor Z(z.data(), DType::kFloat32, Shape{2, 3});
  // k == 0: C = beta * C.
  Tensor A0(e.data(), DType::kFloat32, Shape{2, 0}), B0(f.data(), DType::kFloat32, Shape{0, 3});
  blas::gemm(A0, false, B0, false, Z, 1.0f, 0.0f);
  for (float v : z) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace tutti
