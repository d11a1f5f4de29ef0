// gpu_cnn: bias + activation, ReLU backward, bias gradient, softmax
// cross-entropy and SGD kernels.  Their host twins are the loops in
// host_cnn.cc; --check compares the two (gradcheck.cc).
#include "kernels.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.h"

namespace gpu_cnn {

namespace {

constexpr int kThreads = 256;  // a power of two (bias_grad's tree)

// Grid-stride loops: enough blocks to fill the GPU, never more than needed.
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 8192));
}

void require(bool ok, const char* launcher, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("gpu_cnn::") + launcher + ": " + what);
}

__global__ void bias_act_kernel(float* y, const float* bias, int64_t total, int channels,
                                int64_t inner, bool relu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[(i / inner) % channels];
    // NaN passes through, as std::max(v, 0.0f) on the host.
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

__global__ void relu_backward_kernel(float* dy, const float* y, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
}

__global__ void bias_grad_kernel(const float* dy, float* db, int batch, int channels,
                                 int64_t inner) {
  __shared__ float part[kThreads];
  const int c = blockIdx.x;
  const int64_t count = static_cast<int64_t>(batch) * inner;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const int64_t n = j / inner, i = j - n * inner;
    acc += dy[(n * channels + c) * inner + i];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = part[0];
}

__global__ void softmax_xent_kernel(const float* logits, const int32_t* labels, float* loss,
                                    float* dlogits, int rows, int classes, float grad_scale) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    const float* l = logits + static_cast<int64_t>(r) * classes;
    float* dl = dlogits + static_cast<int64_t>(r) * classes;
    float m = l[0];
    for (int j = 1; j < classes; ++j) m = fmaxf(m, l[j]);
    float sum = 0.0f;
    for (int j = 0; j < classes; ++j) sum += expf(l[j] - m);
    const float lse = m + logf(sum);
    const int y = labels[r];
    loss[r] = lse - l[y];
    for (int j = 0; j < classes; ++j)
      dl[j] = (expf(l[j] - lse) - (j == y ? 1.0f : 0.0f)) * grad_scale;
  }
}

__global__ void sgd_kernel(float* w, const float* g, int64_t n, float lr) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    w[i] -= lr * g[i];
}

}  // namespace

void launch_bias_act(float* y, const float* bias, int64_t total, int channels, int64_t inner,
                     bool relu, cudaStream_t stream) {
  require(total >= 0 && channels > 0 && inner > 0, "launch_bias_act", "bad sizes");
  if (total == 0) return;
  require(y && bias, "launch_bias_act", "null pointer");
  bias_act_kernel<<<blocks_for(total), kThreads, 0, stream>>>(y, bias, total, channels, inner,
                                                              relu);
  CNN_CHECK(cudaGetLastError());
}

void launch_relu_backward(float* dy, const float* y, int64_t total, cudaStream_t stream) {
  require(total >= 0, "launch_relu_backward", "bad size");
  if (total == 0) return;
  require(dy && y, "launch_relu_backward", "null pointer");
  relu_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dy, y, total);
  CNN_CHECK(cudaGetLastError());
}

void launch_bias_grad(const float* dy, float* db, int batch, int channels, int64_t inner,
                      cudaStream_t stream) {
  require(batch >= 0 && channels >= 0 && inner > 0, "launch_bias_grad", "bad sizes");
  if (channels == 0) return;
  require(db && (dy || batch == 0), "launch_bias_grad", "null pointer");
  bias_grad_kernel<<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(dy, db, batch,
                                                                             channels, inner);
  CNN_CHECK(cudaGetLastError());
}

void launch_softmax_xent(const float* logits, const int32_t* labels, float* loss,
                         float* dlogits, int rows, int classes, float grad_scale,
                         cudaStream_t stream) {
  require(rows >= 0 && classes >= 1, "launch_softmax_xent", "bad sizes");
  if (rows == 0) return;
  require(logits && labels && loss && dlogits, "launch_softmax_xent", "null pointer");
  softmax_xent_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(logits, labels, loss, dlogits,
                                                                 rows, classes, grad_scale);
  CNN_CHECK(cudaGetLastError());
}

void launch_sgd(float* w, const float* g, int64_t n, float lr, cudaStream_t stream) {
  require(n >= 0, "launch_sgd", "bad size");
  if (n == 0) return;
  require(w && g, "launch_sgd", "null pointer");
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, g, n, lr);
  CNN_CHECK(cudaGetLastError());
}

}  // namespace gpu_cnn
