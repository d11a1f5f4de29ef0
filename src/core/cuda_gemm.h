// cuBLAS half of core/gemm.h (kUnsupported in builds without CUDA).
#pragma once

#include <cstdint>

#include "tutti/tensor.h"

namespace tutti {
namespace blas {

void cuda_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb,
               const Tensor& c, int64_t m, int64_t n, int64_t k, float alpha,
               float beta, void* stream);

}  // namespace blas
}  // namespace tutti
