#include "data_parallel/mlp_model.h"

#include <cmath>

#include "core/gemm.h"

namespace tutti {
namespace test {
namespace {

// splitmix64: a counter-based generator, so values depend only on the index.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1).
double uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(mix(seed * 0x100000001b3ull + i) >> 11) * 0x1.0p-52 - 1.0;
}

template <typename T>
Tensor matrix(std::vector<T>& v, int64_t rows, int64_t cols) {
  return Tensor(v.data(), DTypeOf<T>::value, Shape{rows, cols});
}

}  // namespace

template <typename T>
Mlp<T>::Mlp(const std::vector<int>& widths, uint64_t seed) : widths_(widths) {
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const int in = widths[l], out = widths[l + 1];
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    std::vector<T> w(static_cast<size_t>(in) * out), b(static_cast<size_t>(out));
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<T>(bound * uniform(seed + 2 * l, i));
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<T>(bound * uniform(seed + 2 * l + 1, i));
    names_.push_back("layer" + std::to_string(l) + ".weight");
    names_.push_back("layer" + std::to_string(l) + ".bias");
    grads_.emplace_back(w.size(), T(0));
    grads_.emplace_back(b.size(), T(0));
    params_.push_back(std::move(w));
    params_.push_back(std::move(b));
  }
  acts_.resize(widths.size());
  for (auto& g : grads_) gptr_.push_back(g.data());
}

template <typename T>
void Mlp<T>::use_grad_storage(int i, T* p) {
  gptr_[static_cast<size_t>(i)] = p ? p : grads_[static_cast<size_t>(i)].data();
}

template <typename T>
Tensor Mlp<T>::shaped(std::vector<T>& v, int i) const {
  const size_t l = static_cast<size_t>(i / 2);
  if (i % 2 == 0) return matrix(v, widths_[l + 1], widths_[l]);
  return Tensor(v.data(), DTypeOf<T>::value, Shape{static_cast<int64_t>(v.size())});
}

template <typename T>
Tensor Mlp<T>::param(int i) {
  return shaped(params_[static_cast<size_t>(i)], i);
}

template <typename T>
Tensor Mlp<T>::grad(int i) {
  Tensor t = shaped(grads_[static_cast<size_t>(i)], i);
  return Tensor(gptr_[static_cast<size_t>(i)], t.dtype(), t.shape());
}

template <typename T>
double Mlp<T>::forward_backward(const T* x, const T* y, int batch, T scale,
                                const std::function<void(int)>& on_ready) {
  const size_t layers = widths_.size() - 1;
  acts_[0].assign(x, x + static_cast<size_t>(batch) * widths_[0]);
  for (size_t l = 0; l < layers; ++l) {
    const int in = widths_[l], out = widths_[l + 1];
    auto& a = acts_[l + 1];
    a.resize(static_cast<size_t>(batch) * out);
    for (int b = 0; b < batch; ++b)  // bias first, then += x W^T
      for (int j = 0; j < out; ++j) a[static_cast<size_t>(b) * out + j] = params_[2 * l + 1][static_cast<size_t>(j)];
    blas::gemm(matrix(acts_[l], batch, in), false, matrix(params_[2 * l], out, in),
               true, matrix(a, batch, out), 1.0f, 1.0f);
    if (l + 1 < layers)
      for (auto& v : a) v = std::tanh(v);
  }
  // d(loss)/d(out) = out - y.
  const auto& o = acts_[layers];
  delta_.resize(o.size());
  double loss = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const T d = o[i] - y[i];
    loss += 0.5 * static_cast<double>(d) * static_cast<double>(d);
    delta_[i] = d * scale;
  }
  for (size_t l = layers; l-- > 0;) {
    const int in = widths_[l], out = widths_[l + 1];
    T* gb = gptr_[2 * l + 1];
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < out; ++j) gb[static_cast<size_t>(j)] += delta_[static_cast<size_t>(b) * out + j];
    if (on_ready) on_ready(static_cast<int>(2 * l + 1));
    blas::gemm(matrix(delta_, batch, out), true, matrix(acts_[l], batch, in), false,
               Tensor(gptr_[2 * l], DTypeOf<T>::value, Shape{out, in}), 1.0f, 1.0f);
    if (on_ready) on_ready(static_cast<int>(2 * l));
    if (l == 0) break;
    delta_prev_.resize(static_cast<size_t>(batch) * in);
    blas::gemm(matrix(delta_, batch, out), false, matrix(params_[2 * l], out, in),
               false, matrix(delta_prev_, batch, in), 1.0f, 0.0f);
    const auto& a = acts_[l];  // tanh output of layer l-1
    for (size_t i = 0; i < delta_prev_.size(); ++i) delta_prev_[i] *= T(1) - a[i] * a[i];
    delta_.swap(delta_prev_);
  }
  return loss;
}

template <typename T>
void Mlp<T>::zero_grad() {
  for (size_t i = 0; i < grads_.size(); ++i)
    std::fill(gptr_[i], gptr_[i] + grads_[i].size(), T(0));
}

template <typename T>
void Mlp<T>::sgd_step(T lr) {
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t j = 0; j < params_[i].size(); ++j) params_[i][j] -= lr * gptr_[i][j];
}

template <typename T>
int64_t Mlp<T>::flops_per_sample() const {
  int64_t f = 0;
  for (size_t l = 0; l + 1 < widths_.size(); ++l)
    f += 3 * static_cast<int64_t>(widths_[l]) * widths_[l + 1];
  return f;
}

template <typename T>
void make_samples(int64_t first, int n, int in, int out, std::vector<T>* x,
                  std::vector<T>* y) {
  x->resize(static_cast<size_t>(n) * in);
  y->resize(static_cast<size_t>(n) * out);
  for (int r = 0; r < n; ++r) {
    const uint64_t row = static_cast<uint64_t>(first + r);
    for (int j = 0; j < in; ++j)
      (*x)[static_cast<size_t>(r) * in + j] = static_cast<T>(uniform(1001, row * 4096 + j));
    for (int j = 0; j < out; ++j)
      (*y)[static_cast<size_t>(r) * out + j] = static_cast<T>(0.5 * uniform(2002, row * 4096 + j));
  }
}

template class Mlp<float>;
template class Mlp<double>;
template void make_samples<float>(int64_t, int, int, int, std::vector<float>*, std::vector<float>*);
template void make_samples<double>(int64_t, int, int, int, std::vector<double>*, std::vector<double>*);

}  // namespace test
}  // namespace tutti
