#include "core/gemm.h"

#include <vector>

#include "core/check.h"
#include "core/cuda_gemm.h"

extern "C" {
// OpenBLAS's CBLAS (declared here so any cblas.h flavour on the include path
// works; the library linked is OpenBLAS).
enum CBLAS_ORDER_T { kCblasRowMajor = 101 };
enum CBLAS_TRANSPOSE_T { kCblasNoTrans = 111, kCblasTrans = 112 };
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta,
                 float* c, int ldc);
void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb,
                 double beta, double* c, int ldc);
void openblas_set_num_threads(int n);
}

namespace tutti {
namespace blas {
namespace {

struct Dims {
  int64_t m, n, k;
};

Dims check_dims(const Tensor& a, bool ta, const Tensor& b, bool tb,
                const Tensor& c) {
  TUTTI_ARG_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
                  "gemm needs 2-D tensors, got A ", a.str(), ", B ", b.str(),
                  ", C ", c.str());
  TUTTI_ARG_CHECK(a.dtype() == b.dtype() && b.dtype() == c.dtype(),
                  "gemm dtypes differ: A ", a.str(), ", B ", b.str(), ", C ",
                  c.str());
  TUTTI_ARG_CHECK(a.device() == b.device() && b.device() == c.device(),
                  "gemm devices differ: A ", a.str(), ", B ", b.str(), ", C ",
                  c.str());
  const int64_t m = ta ? a.shape()[1] : a.shape()[0];
  const int64_t k = ta ? a.shape()[0] : a.shape()[1];
  const int64_t kb = tb ? b.shape()[1] : b.shape()[0];
  const int64_t n = tb ? b.shape()[0] : b.shape()[1];
  TUTTI_ARG_CHECK(k == kb && c.shape()[0] == m && c.shape()[1] == n,
                  "gemm shapes do not agree: op(A) [", m, ", ", k, "], op(B) [",
                  kb, ", ", n, "], C ", c.shape().str());
  return {m, n, k};
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
          float alpha, float beta, void* stream) {
  const Dims d = check_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  if (c.is_cuda()) {
    cuda_gemm(a, ta, b, tb, c, d.m, d.n, d.k, alpha, beta, stream);
    return;
  }
  const int lda = static_cast<int>(a.shape()[1]);
  const int ldb = static_cast<int>(b.shape()[1]);
  const int ldc = static_cast<int>(c.shape()[1]);
  const int opa = ta ? kCblasTrans : kCblasNoTrans;
  const int opb = tb ? kCblasTrans : kCblasNoTrans;
  if (d.k == 0) {
    // C = beta * C; BLAS rejects the zero leading dimensions this implies.
    for (int64_t i = 0; i < c.numel(); ++i)
      store_from_double(c.data(), c.dtype(), static_cast<size_t>(i),
                        beta == 0.0f ? 0.0
                                     : beta * load_as_double(c.data(), c.dtype(),
                                                             static_cast<size_t>(i)));
    return;
  }
  switch (c.dtype()) {
    case DType::kFloat32:
      cblas_sgemm(kCblasRowMajor, opa, opb, static_cast<int>(d.m),
                  static_cast<int>(d.n), static_cast<int>(d.k), alpha,
                  a.data_as<float>(), lda, b.data_as<float>(), ldb, beta,
                  c.data_as<float>(), ldc);
      return;
    case DType::kFloat64:
      cblas_dgemm(kCblasRowMajor, opa, opb, static_cast<int>(d.m),
                  static_cast<int>(d.n), static_cast<int>(d.k), alpha,
                  a.data_as<double>(), lda, b.data_as<double>(), ldb, beta,
                  c.data_as<double>(), ldc);
      return;
    case DType::kFloat16:
    case DType::kBFloat16: {
      // Reference path: widen, multiply in float32, round once.
      std::vector<float> fa(a.numel()), fb(b.numel()), fc(c.numel());
      convert(a.data(), a.dtype(), fa.data(), DType::kFloat32, fa.size());
      convert(b.data(), b.dtype(), fb.data(), DType::kFloat32, fb.size());
      if (beta != 0.0f)
        convert(c.data(), c.dtype(), fc.data(), DType::kFloat32, fc.size());
      cblas_sgemm(kCblasRowMajor, opa, opb, static_cast<int>(d.m),
                  static_cast<int>(d.n), static_cast<int>(d.k), alpha,
                  fa.data(), lda, fb.data(), ldb, beta, fc.data(), ldc);
      convert(fc.data(), DType::kFloat32, c.data(), c.dtype(), fc.size());
      return;
    }
    default:
      TUTTI_THROW(kUnsupported, "gemm on ", dtype_name(c.dtype()),
                  " is not supported (float32, float64, float16, bfloat16)");
  }
}

void set_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

}  // namespace blas
}  // namespace tutti
