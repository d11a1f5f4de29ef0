// gpu_cnn: the model on the host, in float (the CPU fallback, and the
// reference the GPU model is compared with) and in double (the finite-
// difference check).  Convolutions are im2col + plain GEMM loops.
#pragma once

#include <functional>
#include <vector>

#include "cnn.h"

namespace gpu_cnn {

template <typename T>
class HostCnn {
 public:
  explicit HostCnn(const Dims& d);

  const Dims& dims() const { return d_; }
  const ParamLayout& layout() const { return layout_; }
  // Flat buffers (ParamLayout offsets); never reallocated.
  std::vector<T>& params() { return params_; }
  std::vector<T>& grads() { return grads_; }

  // Runs the forward pass on x [N, C, H, W] and labels [N] and returns the
  // mean cross-entropy (accumulated in double).  Keeps the activations for
  // backward().
  double forward(const float* x, const int32_t* labels);
  // Gradients of the last forward() (overwritten, not accumulated); ready(i)
  // is called as soon as gradient i is final, last layer first.
  void backward(const std::function<void(int)>& ready);

 private:
  // y[n, k, :] = relu(W[k, :] . im2col(x[n]) + b[k])
  void conv_forward(const T* x, int c, int h, int w, int k, int stride, int oh, int ow,
                    Param weight, T* y);
  // dy is the gradient after the ReLU mask; writes dW, db and (dx != null)
  // the input gradient.
  void conv_backward(const T* x, int c, int h, int w, int k, int stride, int oh, int ow,
                     Param weight, const T* dy, T* dx);
  void im2col(const T* x, int c, int h, int w, int stride, int oh, int ow, T* col) const;
  void col2im_add(const T* col, int c, int h, int w, int stride, int oh, int ow, T* dx) const;
  // y[n, o] = act(b[o] + sum_i x[n, i] W[o, i])
  void dense_forward(const T* x, int in, int out, Param weight, bool relu, T* y);
  void dense_backward(const T* x, int in, int out, Param weight, const T* dy, T* dx);
  T* p(Param i) { return params_.data() + layout_.slots[i].offset; }
  T* g(Param i) { return grads_.data() + layout_.slots[i].offset; }

  Dims d_;
  ParamLayout layout_;
  std::vector<T> params_, grads_;
  std::vector<int32_t> labels_;
  // activations and their gradients
  std::vector<T> x_, a1_, a2_, h_, logits_, dlogits_, dh_, da2_, da1_, col_, dcol_;
};

extern template class HostCnn<float>;
extern template class HostCnn<double>;

}  // namespace gpu_cnn
