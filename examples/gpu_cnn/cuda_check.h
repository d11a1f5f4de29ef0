// gpu_cnn: error checks for CUDA, cuBLAS and cuDNN calls.
//
//   CNN_CHECK(cudaMalloc(&p, bytes));
//   CNN_CHECK(cublasSgemm(...));
//   CNN_CHECK(cudnnConvolutionForward(...));
//
// A failure throws gpu_cnn::GpuError("file:line: <call> failed: <library
// status name>: <library message>").
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>

namespace gpu_cnn {

class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_gpu_error(const char* expr, const char* file, int line,
                                         const std::string& what) {
  throw GpuError(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                 " failed: " + what);
}

inline void check_status(cudaError_t s, const char* expr, const char* file, int line) {
  if (s == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later checks see their own
  throw_gpu_error(expr, file, line, std::string(cudaGetErrorName(s)) + ": " + cudaGetErrorString(s));
}

inline void check_status(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw_gpu_error(expr, file, line,
                  std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s));
}

inline void check_status(cudnnStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));  // cuDNN 9: why it failed
  std::string what = cudnnGetErrorString(s);
  if (detail[0]) what += std::string(": ") + detail;
  throw_gpu_error(expr, file, line, what);
}

}  // namespace gpu_cnn

#define CNN_CHECK(expr) ::gpu_cnn::check_status((expr), #expr, __FILE__, __LINE__)
