// gpu_cnn: our CUDA kernels (kernels.cu).  Each launcher checks its
// arguments, launches on `stream` (nothing when there is no work) and
// checks the launch; errors throw GpuError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpu_cnn {

// y[i] = act(y[i] + bias[(i / inner) % channels]), act = ReLU or identity.
// Conv output [N, C, H, W]: channels = C, inner = H * W.  Dense output
// [N, F]: channels = F, inner = 1.
void launch_bias_act(float* y, const float* bias, int64_t total, int channels, int64_t inner,
                     bool relu, cudaStream_t stream);

// dy[i] = y[i] > 0 ? dy[i] : 0, where y is the ReLU's output.
void launch_relu_backward(float* dy, const float* y, int64_t total, cudaStream_t stream);

// db[c] = sum over n < batch, i < inner of dy[(n * channels + c) * inner + i]
// (overwrites db; one block per channel, a fixed summation order).
void launch_bias_grad(const float* dy, float* db, int batch, int channels, int64_t inner,
                      cudaStream_t stream);

// Per row n of logits [N, K]: loss[n] = logsumexp(logits[n]) -
// logits[n, label[n]], dlogits[n, :] = (softmax(logits[n]) - onehot) *
// grad_scale.  Labels must be in [0, K) (checked on the host).
void launch_softmax_xent(const float* logits, const int32_t* labels, float* loss,
                         float* dlogits, int rows, int classes, float grad_scale,
                         cudaStream_t stream);

// w[i] -= lr * g[i]
void launch_sgd(float* w, const float* g, int64_t n, float lr, cudaStream_t stream);

}  // namespace gpu_cnn
