// A small MLP classifier with a hand-written backward pass, for the
// data-parallel training example.  Master weights are float32; the forward
// pass reads float16 copies of them (as a float16 GPU model would), and the
// backward pass produces float16 gradients of the *scaled* loss, so that a
// too-large loss scale overflows to Inf exactly as in mixed-precision
// training on a GPU.  The arithmetic itself is float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tutti/tutti.h>

namespace demo {

// Synthetic classification: x ~ N(0, 1) in `inputs` dimensions, label =
// argmax of a fixed random linear "teacher".  Sample i of the stream is a
// pure function of (seed, i), whatever the world size: the data position is
// one global sample index, and a step at any number of ranks sees the same
// global batch (rank r of W takes samples first + r * n .. first + r * n + n - 1,
// n = global batch / W).
class Task {
 public:
  Task(int inputs, int classes, uint64_t seed);
  // Samples first .. first + n - 1 into x [n, inputs] and y [n].
  void batch(int64_t first, int n, std::vector<float>* x, std::vector<int>* y) const;
  int inputs() const { return inputs_; }

 private:
  int inputs_, classes_;
  uint64_t seed_;
  std::vector<float> teacher_;  // [classes, inputs]
};

class Mlp {
 public:
  Mlp(const std::vector<int>& widths, uint64_t seed);

  int num_layers() const { return static_cast<int>(widths_.size()) - 1; }
  // Parameters in registration order: layer0.weight, layer0.bias, ...
  int num_params() const { return 2 * num_layers(); }
  std::string name(int p) const;
  tutti::Shape shape(int p) const;

  std::vector<float>& master(int p) { return master_[p]; }
  std::vector<tutti::Half>& model(int p) { return model_[p]; }
  std::vector<tutti::Half>& grad(int p) { return grad_[p]; }
  std::vector<float>& master_grad(int p) { return master_grad_[p]; }
  std::vector<float>& momentum(int p) { return momentum_[p]; }

  // Mean softmax cross-entropy of the batch (float16 weights), then the
  // backward pass: grad(p) = float16(loss_scale * d loss / d p), reported
  // through on_ready(p) last layer first, as autograd hooks fire.
  template <typename OnReady>
  float forward_backward(const float* x, const int* y, int n, float loss_scale,
                         OnReady on_ready);
  // SGD with momentum on the master weights, then refresh the float16 copy.
  void sgd_step(float lr, float mu);
  // Refreshes the float16 model copy from the master weights.
  void refresh_model();
  // FNV-1a over the master weights' bytes.
  uint64_t hash() const;

 private:
  float forward_backward_impl(const float* x, const int* y, int n,
                              float loss_scale, void (*ready)(void*, int),
                              void* ctx);
  std::vector<int> widths_;
  std::vector<std::vector<float>> master_, master_grad_, momentum_;
  std::vector<std::vector<tutti::Half>> model_, grad_;
  std::vector<std::vector<float>> acts_, w_;  // scratch
};

template <typename OnReady>
float Mlp::forward_backward(const float* x, const int* y, int n, float loss_scale,
                            OnReady on_ready) {
  return forward_backward_impl(
      x, y, n, loss_scale,
      [](void* ctx, int p) { (*static_cast<OnReady*>(ctx))(p); }, &on_ready);
}

}  // namespace demo
