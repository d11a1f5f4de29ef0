// StreamHold: a one-thread kernel that holds a CUDA stream until release()
// (or a time limit), for probes that need an operation to hang on a device.
#pragma once

#include <cuda_runtime_api.h>

namespace tutti_test {

class StreamHold {
 public:
  // Launches the holding kernel on `stream`; it ends at release(), at
  // destruction, or after `limit_s` seconds, whichever comes first.
  StreamHold(cudaStream_t stream, double limit_s);
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  // cudaSuccess when the kernel was launched.
  cudaError_t error() const { return error_; }
  void release();

 private:
  int* flag_ = nullptr;  // pinned, mapped: the kernel polls it
  cudaError_t error_ = cudaSuccess;
};

}  // namespace tutti_test
