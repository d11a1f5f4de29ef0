#include "core/cuda_gemm.h"

#include "core/check.h"
#include "core/cuda_utils.h"

#if TUTTI_WITH_CUDA
#include <cublas_v2.h>

#include <mutex>
#include <unordered_map>
#endif

namespace tutti {
namespace blas {

#if TUTTI_WITH_CUDA
namespace {

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    TUTTI_THROW(kCuda, what, " failed: ", cublasGetStatusName(s), " (",
                cublasGetStatusString(s), ")");
}

// One cuBLAS handle per device, created on first use and kept for the
// process (handles are expensive; cublasSetStream makes them reusable).
cublasHandle_t handle_for(int device) {
  static std::mutex mu;
  static std::unordered_map<int, cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cuda::DeviceGuard g(device);
  cublasHandle_t h;
  check_cublas(cublasCreate(&h), "cublasCreate");
  handles.emplace(device, h);
  return h;
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default:
      TUTTI_THROW(kUnsupported, "CUDA gemm on ", dtype_name(d),
                  " is not supported (float32, float16, bfloat16)");
  }
}

}  // namespace

void cuda_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb,
               const Tensor& c, int64_t m, int64_t n, int64_t k, float alpha,
               float beta, void* stream) {
  const int device = c.device().index;
  cuda::DeviceGuard g(device);
  cublasHandle_t h = handle_for(device);
  static std::mutex call_mu;  // handle + stream binding is not thread-safe
  std::lock_guard<std::mutex> lock(call_mu);
  check_cublas(cublasSetStream(h, static_cast<cudaStream_t>(stream)),
               "cublasSetStream");
  const cudaDataType_t t = cuda_type(c.dtype());
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B
  // first with the same transpose flags and swapped m/n.
  const int lda = static_cast<int>(a.shape()[1]);
  const int ldb = static_cast<int>(b.shape()[1]);
  const int ldc = static_cast<int>(c.shape()[1]);
  check_cublas(
      cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &alpha, b.data(),
                   t, ldb, a.data(), t, lda, &beta, c.data(), t, ldc,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

#else

void cuda_gemm(const Tensor& a, bool, const Tensor&, bool, const Tensor&,
               int64_t, int64_t, int64_t, float, float, void*) {
  TUTTI_THROW(kUnsupported, "gemm on ", a.str(),
              ": this build of tutti has no CUDA support");
}

#endif

}  // namespace blas
}  // namespace tutti
