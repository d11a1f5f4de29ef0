// A kernel that holds a CUDA stream until the host says so: the NCCL
// watchdog probe's way to make an operation genuinely hang at one rank
// (the op is ordered after the held stream, so it cannot complete, and
// only the watchdog's timeout ends it), as a peer that never arrives does.
#include "stream_hold.h"

namespace tutti_test {
namespace {

__device__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *release != 0 (host-mapped memory the host writes) or
// `limit_ns` passed: a probe that dies before releasing cannot hold the GPU
// for longer than that.
__global__ void hold_kernel(const volatile int* release, unsigned long long limit_ns) {
  const unsigned long long start = globaltimer_ns();
  while (*release == 0 && globaltimer_ns() - start < limit_ns) __nanosleep(1000);
}

}  // namespace

StreamHold::StreamHold(cudaStream_t stream, double limit_s) {
  cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int),
                                cudaHostAllocMapped);
  if (e != cudaSuccess) { error_ = e; return; }
  *flag_ = 0;
  int* device_flag = nullptr;
  e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), flag_, 0);
  if (e != cudaSuccess) { error_ = e; return; }
  hold_kernel<<<1, 1, 0, stream>>>(device_flag,
                                   static_cast<unsigned long long>(limit_s * 1e9));
  error_ = cudaGetLastError();
}

void StreamHold::release() {
  if (flag_) *reinterpret_cast<volatile int*>(flag_) = 1;
}

StreamHold::~StreamHold() {
  release();
  if (flag_) cudaFreeHost(flag_);  // synchronises with the kernel's end
}

}  // namespace tutti_test
