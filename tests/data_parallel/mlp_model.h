// A small multilayer perceptron with a hand-written backward pass, for
// data-parallel tests and benchmarks (reusable by other layers).
//
// Layers: widths[0] -> widths[1] -> ... -> widths.back(); tanh between
// layers, linear output, loss = sum over the batch of 0.5 * ||out - y||^2.
// Parameters are registered in forward order (layer0.weight [out, in],
// layer0.bias [out], layer1.weight, ...).  backward() visits the layers
// last-first and reports each gradient through `on_ready` as soon as it is
// final, the way autograd hooks fire, so a reducer can overlap its
// all-reduces with the rest of the backward pass.  Gradients ACCUMULATE
// (+=) like PyTorch's .grad; zero_grad() clears them.  GEMMs go through
// tutti's BLAS (OpenBLAS), float or double.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/tensor.h"

namespace tutti {
namespace test {

template <typename T>
class Mlp {
 public:
  // Weights uniform in +-1/sqrt(fan_in) from a fixed-seed generator: equal
  // seeds give bit-identical models in every process.
  Mlp(const std::vector<int>& widths, uint64_t seed);
  // Not copyable: a copy's gradients would still point at this model's
  // storage.  A move keeps the vectors' buffers, so it stays valid.
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;
  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;

  int num_params() const { return static_cast<int>(params_.size()); }
  const std::string& name(int i) const { return names_[static_cast<size_t>(i)]; }
  Tensor param(int i);
  Tensor grad(int i);
  std::vector<T>& param_data(int i) { return params_[static_cast<size_t>(i)]; }
  // The model's own gradient storage (not the storage use_grad_storage()
  // set).
  std::vector<T>& grad_data(int i) { return grads_[static_cast<size_t>(i)]; }
  // Gradient i lives at `p` (grad(i).numel() elements, e.g. a reducer's
  // bucket view, Reducer::gradient(i)) from now on; nullptr: back to the
  // model's own storage.
  void use_grad_storage(int i, T* p);

  // Forward on `batch` rows of x [batch, widths[0]] against y [batch,
  // widths.back()], then backward: grads += scale * d(loss)/d(params).
  // Returns the unscaled loss.  on_ready(i) (may be empty) fires for the
  // bias, then the weight, of the last layer first.
  double forward_backward(const T* x, const T* y, int batch, T scale,
                          const std::function<void(int)>& on_ready);
  void zero_grad();
  // params -= lr * grads.
  void sgd_step(T lr);
  // Number of multiply-adds of one forward+backward per sample.
  int64_t flops_per_sample() const;

 private:
  // Parameter i's storage v as [out, in] (weights) or [out] (biases).
  Tensor shaped(std::vector<T>& v, int i) const;
  std::vector<int> widths_;
  std::vector<std::string> names_;
  std::vector<std::vector<T>> params_, grads_;
  std::vector<T*> gptr_;  // where gradient i lives: grads_[i] or external
  std::vector<std::vector<T>> acts_;  // scratch: activations per layer
  std::vector<T> delta_, delta_prev_;
};

// Deterministic inputs/targets for sample rows [first, first + n): the same
// row index gives the same values in every process.
template <typename T>
void make_samples(int64_t first, int n, int in, int out, std::vector<T>* x,
                  std::vector<T>* y);

}  // namespace test
}  // namespace tutti
