#include "core/cuda_gemm.h"

#include "core/check.h"
#include "core/cuda_utils.h"

#if TUTTI_WITH_CUDA
#include <cublas_v2.h>

#include <memory>
#include <mutex>

#include "core/stream_cache.h"
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

// cuBLAS keeps scratch in a workspace bound to its handle; two GEMMs on
// different streams that share a handle (tensor-parallel layers on the
// compute stream, PowerSGD on the reducer's stream) would share that scratch
// while running concurrently.  So every (device, stream) gets its own handle
// and its own workspace (cublasSetWorkspace), created on first use and kept
// for the process; the entry's mutex serialises threads that share a stream.
// 32 MiB is what cuBLAS recommends for Hopper (4 MiB is enough before it).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct StreamBlas {
  int device = -1;
  cublasHandle_t handle = nullptr;
  cuda::DeviceBuffer workspace;
  ~StreamBlas() {
    if (!handle) return;
    try {
      cuda::DeviceGuard g(device);  // the device the handle was created on
      cublasDestroy(handle);
    } catch (...) {  // a destructor: the guard's failure is not raised
    }
  }
};

StreamCache<StreamBlas>::Entry& blas_for(int device, cudaStream_t stream) {
  static StreamCache<StreamBlas>* cache = new StreamCache<StreamBlas>();
  // Never destroyed: handles outliving the CUDA runtime at exit would fail
  // in cublasDestroy.  tutti::shutdown() releases the handles and
  // workspaces (release_stream_caches()).
  return cache->get(device, stream, [&] {
    auto b = std::make_unique<StreamBlas>();
    b->device = device;
    b->workspace = cuda::DeviceBuffer(device, kWorkspaceBytes);
    check_cublas(cublasCreate(&b->handle), "cublasCreate");
    check_cublas(cublasSetStream(b->handle, stream), "cublasSetStream");
    check_cublas(cublasSetWorkspace(b->handle, b->workspace.data(),
                                    b->workspace.bytes()),
                 "cublasSetWorkspace");
    return b;
  });
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
  cuda::DeviceGuard g(device);  // cublasCreate binds the current device
  auto& entry = blas_for(device, static_cast<cudaStream_t>(stream));
  std::lock_guard<std::mutex> lock(entry.mu);
  cublasHandle_t h = entry.value->handle;
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
