// Dense matrix multiply for tutti's layers (tensor-parallel linear layers,
// PowerSGD): OpenBLAS on the CPU, cuBLAS on CUDA devices.
#pragma once

#include "tutti/tensor.h"

namespace tutti {
namespace blas {

// Row-major C = alpha * op(A) @ op(B) + beta * C with 2-D contiguous
// tensors: op(A) is [m, k], op(B) is [k, n], C is [m, n].
// CPU: float32 and float64 natively; float16/bfloat16 are computed in
// float32 and rounded once.  CUDA: float32, float16, bfloat16 with float32
// accumulation (cublasGemmEx), on `stream` (a cudaStream_t; nullptr: the
// default stream), through a cuBLAS handle and workspace of that (device,
// stream) alone, so GEMMs on different streams never share scratch; any
// thread may call (the device of C is set for the call).  All tensors must
// share dtype and device.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
          const Tensor& c, float alpha = 1.0f, float beta = 0.0f,
          void* stream = nullptr);

// Threads OpenBLAS may use in this process (tutti::init sets
// cores / ranks-on-this-node so ranks do not oversubscribe the CPU).
void set_num_threads(int n);

}  // namespace blas
}  // namespace tutti
