// PowerSGD kernels: orthonormalisation and fused decompression (CPU
// references in src/compression/powersgd.cc).
#include "kernels/compression_powersgd.h"

#include "compression/hash.h"
#include "compression/powersgd.h"
#include "kernels/compression_device.cuh"

namespace tutti {
namespace kernels {
namespace {

constexpr int kOrthoThreads = 512;

__device__ double column_norm(const float* p, int64_t m, int64_t r, int64_t j) {
  double s = 0;
  for (int64_t row = threadIdx.x; row < m; row += blockDim.x)
    s += static_cast<double>(p[row * r + j]) * p[row * r + j];
  return sqrt(dev::block_sum<double>(s));
}

// Modified Gram-Schmidt of one m x r matrix by the whole block.
__device__ void orthogonalize_block(float* p, int64_t m, int64_t r,
                                    uint64_t seed, uint64_t stream_id,
                                    double dependent) {
  for (int64_t j = 0; j < r; ++j) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const double before = column_norm(p, m, r, j);
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t i = 0; i < j; ++i) {
          double d = 0;
          for (int64_t row = threadIdx.x; row < m; row += blockDim.x)
            d += static_cast<double>(p[row * r + i]) * p[row * r + j];
          const float dot = static_cast<float>(dev::block_sum<double>(d));
          for (int64_t row = threadIdx.x; row < m; row += blockDim.x)
            p[row * r + j] -= dot * p[row * r + i];
          __syncthreads();
        }
      const double norm = column_norm(p, m, r, j);
      if (isnan(norm) || (norm >= 1e-30 && norm > dependent * before)) {
        const float fn = static_cast<float>(norm);
        for (int64_t row = threadIdx.x; row < m; row += blockDim.x)
          p[row * r + j] /= fn;
        __syncthreads();
        break;
      }
      for (int64_t row = threadIdx.x; row < m; row += blockDim.x)
        p[row * r + j] = attempt == 0
            ? compression::hash_uniform_hd(seed, stream_id,
                                           static_cast<uint64_t>(row * r + j))
            : 0.0f;
      __syncthreads();
    }
  }
}

__global__ void orthogonalize_kernel(float* p, int64_t m, int64_t r,
                                     uint64_t seed, uint64_t stream_id,
                                     double dependent) {
  orthogonalize_block(p, m, r, seed, stream_id, dependent);
}

__global__ void orthogonalize_slots_kernel(float* p_all,
                                           const PowerSgdOrthoSlot* slots,
                                           uint64_t seed, double dependent) {
  const PowerSgdOrthoSlot s = slots[blockIdx.x];
  if (s.m == 0 || s.r == 0) return;  // uniform per block: no barrier skipped
  orthogonalize_block(p_all + s.p_off, s.m, s.r, seed, s.stream_id, dependent);
}

template <typename T>
__global__ void decompress_kernel(const float* p, const float* q, int64_t m,
                                  int64_t n, int64_t r, float* residual,
                                  T* grad) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    float acc = 0.0f;
    for (int64_t k = 0; k < r; ++k)
      acc = __fadd_rn(acc, __fmul_rn(p[i * r + k], q[j * r + k]));
    residual[e] = __fsub_rn(residual[e], acc);
    grad[e] = dev::from_f32<T>(acc);
  }
}

}  // namespace

void launch_powersgd_orthogonalize(float* p, int64_t m, int64_t r,
                                   uint64_t seed, uint64_t stream_id,
                                   cudaStream_t stream) {
  TUTTI_ARG_CHECK(m >= 0 && r >= 0, "powersgd_orthogonalize: bad shape [", m,
                  ", ", r, "]");
  TUTTI_ARG_CHECK(m * r == 0 || p, "powersgd_orthogonalize: null pointer");
  if (m == 0 || r == 0) return;
  orthogonalize_kernel<<<1, kOrthoThreads, 0, stream>>>(
      p, m, r, seed, stream_id, compression::kPowerSgdDependent);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_powersgd_orthogonalize_slots(float* p_all,
                                         const PowerSgdOrthoSlot* slots,
                                         int64_t count, uint64_t seed,
                                         cudaStream_t stream) {
  TUTTI_ARG_CHECK(count >= 0 && count <= 0x7fffffff,
                  "powersgd_orthogonalize_slots: ", count, " slots");
  TUTTI_ARG_CHECK(count == 0 || (p_all && slots),
                  "powersgd_orthogonalize_slots: null pointer");
  if (count == 0) return;
  orthogonalize_slots_kernel<<<static_cast<unsigned>(count), kOrthoThreads, 0,
                               stream>>>(p_all, slots, seed,
                                         compression::kPowerSgdDependent);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_powersgd_decompress(const float* p, const float* q, int64_t m,
                                int64_t n, int64_t r, float* residual,
                                void* grad, DType dtype, cudaStream_t stream) {
  TUTTI_ARG_CHECK(m >= 0 && n >= 0 && r >= 0, "powersgd_decompress: bad shape m=",
                  m, " n=", n, " r=", r);
  TUTTI_ARG_CHECK(m * n == 0 || (p && q && residual && grad),
                  "powersgd_decompress: null pointer");
  if (m * n == 0) return;
  dev::dispatch_float(dtype, "powersgd_decompress", [&](auto t) {
    using T = decltype(t);
    decompress_kernel<T><<<dev::grid_for(m * n), dev::kThreads, 0, stream>>>(
        p, q, m, n, r, residual, static_cast<T*>(grad));
  });
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
