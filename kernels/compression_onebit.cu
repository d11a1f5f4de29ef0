// 1-bit sign compression kernels (CPU references in
// src/compression/onebit.cc).
#include "kernels/compression_onebit.h"

#include "kernels/compression_device.cuh"

namespace tutti {
namespace kernels {
namespace {

constexpr int kEncodeThreads = 256;

__global__ void encode_kernel(float* x, int64_t n, int64_t chunk,
                              int64_t nchunks, uint32_t* block) {
  const int64_t c = blockIdx.x;
  const int64_t begin = c * chunk;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  double part = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    part += fabs(static_cast<double>(x[i]));
  const double sum = dev::block_sum<double>(part);
  const float scale = static_cast<float>(sum / static_cast<double>(end - begin));
  if (threadIdx.x == 0) block[c] = __float_as_uint(scale);
  uint32_t* words = block + nchunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  // Warp-sized groups of 32 elements, one word each (chunk % 32 == 0).
  for (int64_t w0 = begin + int64_t(warp) * 32; w0 < end; w0 += int64_t(nwarps) * 32) {
    const int64_t i = w0 + lane;
    bool pos = false;
    if (i < end) {
      const float v = x[i];
      pos = !(v < 0.0f);
      x[i] = __fsub_rn(v, pos ? scale : -scale);
    }
    const uint32_t word = __ballot_sync(0xffffffffu, pos);
    if (lane == 0) words[w0 / 32] = word;
  }
}

template <typename T>
__global__ void decode_sum_kernel(const uint32_t* blocks, int world, int64_t n,
                                  int64_t chunk, int64_t nchunks, int64_t bw,
                                  float divisor, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i / chunk, w = i / 32;
    const uint32_t bit = 1u << (i & 31);
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) {
      const uint32_t* blk = blocks + int64_t(r) * bw;
      const float s = __uint_as_float(blk[c]);
      acc = __fadd_rn(acc, (blk[nchunks + w] & bit) ? s : -s);
    }
    out[i] = dev::from_f32<T>(__fdiv_rn(acc, divisor));
  }
}

void check_chunk(int64_t n, int64_t chunk, const char* what) {
  TUTTI_ARG_CHECK(n >= 0, what, ": negative element count ", n);
  TUTTI_ARG_CHECK(chunk > 0 && chunk % 32 == 0, what, ": chunk ", chunk,
                  " must be a positive multiple of 32");
}

}  // namespace

void launch_onebit_encode(float* x, int64_t n, int64_t chunk, uint32_t* block,
                          cudaStream_t stream) {
  check_chunk(n, chunk, "onebit_encode");
  TUTTI_ARG_CHECK(n == 0 || (x && block), "onebit_encode: null pointer");
  if (n == 0) return;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  TUTTI_ARG_CHECK(nchunks <= 0x7fffffffLL, "onebit_encode: ", nchunks,
                  " chunks exceed the grid limit");
  encode_kernel<<<static_cast<unsigned>(nchunks), kEncodeThreads, 0, stream>>>(
      x, n, chunk, nchunks, block);
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_onebit_decode_sum(const uint32_t* blocks, int world, int64_t n,
                              int64_t chunk, float divisor, void* out,
                              DType dtype, cudaStream_t stream) {
  check_chunk(n, chunk, "onebit_decode_sum");
  TUTTI_ARG_CHECK(world >= 1, "onebit_decode_sum: world ", world, " < 1");
  TUTTI_ARG_CHECK(divisor > 0, "onebit_decode_sum: divisor ", divisor,
                  " must be > 0");
  TUTTI_ARG_CHECK(n == 0 || (blocks && out), "onebit_decode_sum: null pointer");
  if (n == 0) return;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  const int64_t bw = nchunks + (n + 31) / 32;
  dev::dispatch_float(dtype, "onebit_decode_sum", [&](auto t) {
    using T = decltype(t);
    decode_sum_kernel<T><<<dev::grid_for(n), dev::kThreads, 0, stream>>>(
        blocks, world, n, chunk, nchunks, bw, divisor, static_cast<T*>(out));
  });
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
