// Bias add, bias gradient and sum of squares for the tensor-parallel linear
// layers.  CPU twins: src/tensor_parallel/cpu_kernels.cc.
#include "kernels/tensor_parallel_device.h"
#include "kernels/tensor_parallel_linear.h"

#include <algorithm>

namespace tutti {
namespace kernels {
namespace {

using tpdev::from_float;
using tpdev::to_float;

template <typename T>
__global__ void bias_add_kernel(T* out, const T* bias, int64_t rows,
                                int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % cols]));
}

// One block per 32 columns: 32 x 8 threads, threadIdx.x walks columns
// (coalesced), threadIdx.y strides over rows; the 8 partial sums of a
// column are then added in shared memory.
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

template <typename T>
__global__ void bias_grad_kernel(const T* dy, T* db, int64_t rows,
                                 int64_t cols) {
  __shared__ float part[kRowLanes][kColTile + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes)
      acc += to_float(dy[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) s += part[y][threadIdx.x];
    db[c] = from_float<T>(to_float(db[c]) + s);
  }
}

template <typename T>
__global__ void sum_squares_partials_kernel(const T* x, int64_t n,
                                            double* partials, int32_t* blocks) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = to_float(x[i]);
    acc += v * v;
  }
  acc = tpdev::block_sum(acc);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    if (blockIdx.x == 0) *blocks = static_cast<int32_t>(gridDim.x);
  }
}

// One block per tensor; thread j reads partial j (blockDim.x ==
// kSumSquaresMaxPartials), block_sum adds them in a fixed order.
__global__ void sum_squares_finish_kernel(const double* partials,
                                          const int32_t* blocks, double* out) {
  const int64_t t = blockIdx.x;
  const double v = static_cast<int>(threadIdx.x) < blocks[t]
                       ? partials[t * kSumSquaresMaxPartials + threadIdx.x]
                       : 0.0;
  const double s = tpdev::block_sum(v);
  if (threadIdx.x == 0) out[t] = s;
}

}  // namespace

void launch_bias_add(void* out, const void* bias, DType dtype, int64_t rows,
                     int64_t cols, cudaStream_t stream) {
  TUTTI_ARG_CHECK(rows >= 0 && cols >= 0, "bias_add: shape [", rows, ", ", cols,
                  "]");
  tpdev::check_launch_args("bias_add", rows * cols, out && bias);
  if (rows * cols == 0) return;
  tpdev::dispatch_float(dtype, "bias_add", [&](auto tag) {
    using T = decltype(tag);
    bias_add_kernel<T>
        <<<tpdev::grid_for(rows * cols), tpdev::kBlock, 0, stream>>>(
            static_cast<T*>(out), static_cast<const T*>(bias), rows, cols);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_bias_grad(const void* dy, void* db, DType dtype, int64_t rows,
                      int64_t cols, cudaStream_t stream) {
  TUTTI_ARG_CHECK(rows >= 0 && cols >= 0, "bias_grad: shape [", rows, ", ",
                  cols, "]");
  tpdev::check_launch_args("bias_grad", cols, db && (rows == 0 || dy));
  if (cols == 0 || rows == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((cols + kColTile - 1) / kColTile);
  tpdev::dispatch_float(dtype, "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    bias_grad_kernel<T><<<blocks, dim3(kColTile, kRowLanes), 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(db), rows, cols);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_sum_squares_partials(const void* x, DType dtype, int64_t n,
                                 double* partials, int32_t* blocks,
                                 cudaStream_t stream) {
  tpdev::check_launch_args("sum_squares_partials", n, x != nullptr);
  TUTTI_ARG_CHECK(partials && blocks, "sum_squares_partials: null output");
  const unsigned grid = n == 0 ? 1u : std::min<unsigned>(
      tpdev::grid_for(n), static_cast<unsigned>(kSumSquaresMaxPartials));
  // n == 0 still launches one block, so partials[0] = 0 and *blocks = 1.
  tpdev::dispatch_float(dtype, "sum_squares_partials", [&](auto tag) {
    using T = decltype(tag);
    sum_squares_partials_kernel<T><<<grid, tpdev::kBlock, 0, stream>>>(
        static_cast<const T*>(x), n, partials, blocks);
  });
  TUTTI_LAUNCH_CHECK(stream);
}

void launch_sum_squares_finish(const double* partials, const int32_t* blocks,
                               int64_t count, double* out,
                               cudaStream_t stream) {
  tpdev::check_launch_args("sum_squares_finish", count,
                           partials && blocks && out);
  TUTTI_ARG_CHECK(count <= 0x7fffffff, "sum_squares_finish: ", count,
                  " tensors exceed the grid limit");
  if (count == 0) return;
  sum_squares_finish_kernel<<<static_cast<unsigned>(count),
                              kSumSquaresMaxPartials, 0, stream>>>(
      partials, blocks, out);
  TUTTI_LAUNCH_CHECK(stream);
}

}  // namespace kernels
}  // namespace tutti
