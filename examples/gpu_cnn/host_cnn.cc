// gpu_cnn: the host model (see host_cnn.h) and the CPU backend built on it.
#include "host_cnn.h"

#include <algorithm>
#include <cmath>

namespace gpu_cnn {

template <typename T>
HostCnn<T>::HostCnn(const Dims& d) : d_(d), layout_(d) {
  d_.validate();
  params_.assign(static_cast<size_t>(layout_.total), T(0));
  grads_.assign(static_cast<size_t>(layout_.total), T(0));
  const size_t n = static_cast<size_t>(d.batch);
  x_.resize(n * d.image());
  a1_.resize(n * d.k1 * d.h1() * d.w1());
  a2_.resize(n * d.flat());
  h_.resize(n * d.hidden);
  logits_.resize(n * d.classes);
  dlogits_.resize(logits_.size());
  dh_.resize(h_.size());
  da2_.resize(a2_.size());
  da1_.resize(a1_.size());
  const size_t rows = static_cast<size_t>(std::max(d.channels, d.k1)) * d.kernel * d.kernel;
  const size_t cols = static_cast<size_t>(std::max(d.h1() * d.w1(), d.h2() * d.w2()));
  col_.resize(rows * cols);
  dcol_.resize(rows * cols);
}

namespace {

// Calls f(j, i) for element j of the im2col matrix [c * R * R, oh * ow] of
// one image [c, h, w] (row (ci, ky, kx), column (oy, ox)), where i is the
// image element it reads, or -1 inside the zero padding.
template <typename F>
void for_each_patch(const Dims& d, int c, int h, int w, int stride, int oh, int ow, F&& f) {
  const int r = d.kernel;
  int64_t j = 0;
  for (int ci = 0; ci < c; ++ci)
    for (int ky = 0; ky < r; ++ky)
      for (int kx = 0; kx < r; ++kx)
        for (int oy = 0; oy < oh; ++oy) {
          const int iy = oy * stride - d.pad + ky;
          for (int ox = 0; ox < ow; ++ox, ++j) {
            const int ix = ox * stride - d.pad + kx;
            const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
            f(j, inside ? (static_cast<int64_t>(ci) * h + iy) * w + ix : int64_t{-1});
          }
        }
}

}  // namespace

template <typename T>
void HostCnn<T>::im2col(const T* x, int c, int h, int w, int stride, int oh, int ow,
                        T* col) const {
  for_each_patch(d_, c, h, w, stride, oh, ow,
                 [&](int64_t j, int64_t i) { col[j] = i >= 0 ? x[i] : T(0); });
}

template <typename T>
void HostCnn<T>::col2im_add(const T* col, int c, int h, int w, int stride, int oh, int ow,
                            T* dx) const {
  for_each_patch(d_, c, h, w, stride, oh, ow, [&](int64_t j, int64_t i) {
    if (i >= 0) dx[i] += col[j];
  });
}

template <typename T>
void HostCnn<T>::conv_forward(const T* x, int c, int h, int w, int k, int stride, int oh,
                              int ow, Param weight, T* y) {
  const int64_t q_len = int64_t{c} * d_.kernel * d_.kernel, p_len = int64_t{oh} * ow;
  const T* wt = p(weight);
  const T* b = p(static_cast<Param>(weight + 1));
  for (int n = 0; n < d_.batch; ++n) {
    im2col(x + n * int64_t{c} * h * w, c, h, w, stride, oh, ow, col_.data());
    T* yn = y + n * k * p_len;
    for (int kk = 0; kk < k; ++kk) {
      T* row = yn + kk * p_len;
      std::fill(row, row + p_len, b[kk]);
      for (int64_t q = 0; q < q_len; ++q) {
        const T wq = wt[kk * q_len + q];
        const T* cq = col_.data() + q * p_len;
        for (int64_t i = 0; i < p_len; ++i) row[i] += wq * cq[i];
      }
      for (int64_t i = 0; i < p_len; ++i) row[i] = std::max(row[i], T(0));
    }
  }
}

template <typename T>
void HostCnn<T>::conv_backward(const T* x, int c, int h, int w, int k, int stride, int oh,
                               int ow, Param weight, const T* dy, T* dx) {
  const int64_t q_len = int64_t{c} * d_.kernel * d_.kernel, p_len = int64_t{oh} * ow;
  const T* wt = p(weight);
  T* dw = g(weight);
  T* db = g(static_cast<Param>(weight + 1));
  std::fill(dw, dw + k * q_len, T(0));
  std::fill(db, db + k, T(0));
  if (dx) std::fill(dx, dx + d_.batch * int64_t{c} * h * w, T(0));
  for (int n = 0; n < d_.batch; ++n) {
    im2col(x + n * int64_t{c} * h * w, c, h, w, stride, oh, ow, col_.data());
    const T* dyn = dy + n * k * p_len;
    for (int kk = 0; kk < k; ++kk) {
      const T* drow = dyn + kk * p_len;
      T bsum = 0;
      for (int64_t i = 0; i < p_len; ++i) bsum += drow[i];
      db[kk] += bsum;
      for (int64_t q = 0; q < q_len; ++q) {
        const T* cq = col_.data() + q * p_len;
        T acc = 0;
        for (int64_t i = 0; i < p_len; ++i) acc += drow[i] * cq[i];
        dw[kk * q_len + q] += acc;
      }
    }
    if (!dx) continue;
    std::fill(dcol_.begin(), dcol_.begin() + q_len * p_len, T(0));
    for (int kk = 0; kk < k; ++kk)
      for (int64_t q = 0; q < q_len; ++q) {
        const T wq = wt[kk * q_len + q];
        const T* drow = dyn + kk * p_len;
        T* dq = dcol_.data() + q * p_len;
        for (int64_t i = 0; i < p_len; ++i) dq[i] += wq * drow[i];
      }
    col2im_add(dcol_.data(), c, h, w, stride, oh, ow, dx + n * int64_t{c} * h * w);
  }
}

template <typename T>
void HostCnn<T>::dense_forward(const T* x, int in, int out, Param weight, bool relu, T* y) {
  const T* wt = p(weight);
  const T* b = p(static_cast<Param>(weight + 1));
  for (int n = 0; n < d_.batch; ++n)
    for (int o = 0; o < out; ++o) {
      T acc = b[o];
      const T* xr = x + int64_t{n} * in;
      const T* wr = wt + int64_t{o} * in;
      for (int i = 0; i < in; ++i) acc += xr[i] * wr[i];
      y[n * out + o] = relu ? std::max(acc, T(0)) : acc;
    }
}

template <typename T>
void HostCnn<T>::dense_backward(const T* x, int in, int out, Param weight, const T* dy, T* dx) {
  const T* wt = p(weight);
  T* dw = g(weight);
  T* db = g(static_cast<Param>(weight + 1));
  std::fill(dw, dw + int64_t{out} * in, T(0));
  std::fill(db, db + out, T(0));
  for (int n = 0; n < d_.batch; ++n)
    for (int o = 0; o < out; ++o) {
      const T go = dy[n * out + o];
      db[o] += go;
      const T* xr = x + int64_t{n} * in;
      T* dwr = dw + int64_t{o} * in;
      for (int i = 0; i < in; ++i) dwr[i] += go * xr[i];
    }
  if (!dx) return;
  for (int n = 0; n < d_.batch; ++n)
    for (int i = 0; i < in; ++i) {
      T acc = 0;
      for (int o = 0; o < out; ++o) acc += dy[n * out + o] * wt[int64_t{o} * in + i];
      dx[int64_t{n} * in + i] = acc;
    }
}

template <typename T>
double HostCnn<T>::forward(const float* x, const int32_t* labels) {
  const Dims& d = d_;
  std::copy(x, x + x_.size(), x_.begin());
  labels_.assign(labels, labels + d.batch);
  conv_forward(x_.data(), d.channels, d.height, d.width, d.k1, d.stride1, d.h1(), d.w1(),
               kConv1W, a1_.data());
  conv_forward(a1_.data(), d.k1, d.h1(), d.w1(), d.k2, d.stride2, d.h2(), d.w2(), kConv2W,
               a2_.data());
  dense_forward(a2_.data(), static_cast<int>(d.flat()), d.hidden, kFc1W, true, h_.data());
  dense_forward(h_.data(), d.hidden, d.classes, kFc2W, false, logits_.data());
  double total = 0;
  for (int n = 0; n < d.batch; ++n) {
    const T* l = logits_.data() + n * d.classes;
    const T m = *std::max_element(l, l + d.classes);
    T sum = 0;
    for (int j = 0; j < d.classes; ++j) sum += std::exp(l[j] - m);
    const T lse = m + std::log(sum);
    total += static_cast<double>(lse - l[labels_[n]]);
  }
  return total / d.batch;
}

template <typename T>
void HostCnn<T>::backward(const std::function<void(int)>& ready) {
  const Dims& d = d_;
  auto mark = [&](Param weight) {
    ready(weight);
    ready(weight + 1);
  };
  auto relu_mask = [](std::vector<T>& grad, const std::vector<T>& act) {
    for (size_t i = 0; i < grad.size(); ++i)
      if (!(act[i] > T(0))) grad[i] = T(0);
  };
  const T inv_n = T(1) / static_cast<T>(d.batch);
  for (int n = 0; n < d.batch; ++n) {
    const T* l = logits_.data() + n * d.classes;
    T* dl = dlogits_.data() + n * d.classes;
    const T m = *std::max_element(l, l + d.classes);
    T sum = 0;
    for (int j = 0; j < d.classes; ++j) sum += std::exp(l[j] - m);
    const T lse = m + std::log(sum);
    for (int j = 0; j < d.classes; ++j)
      dl[j] = (std::exp(l[j] - lse) - (j == labels_[n] ? T(1) : T(0))) * inv_n;
  }
  dense_backward(h_.data(), d.hidden, d.classes, kFc2W, dlogits_.data(), dh_.data());
  mark(kFc2W);
  relu_mask(dh_, h_);
  dense_backward(a2_.data(), static_cast<int>(d.flat()), d.hidden, kFc1W, dh_.data(),
                 da2_.data());
  mark(kFc1W);
  relu_mask(da2_, a2_);
  conv_backward(a1_.data(), d.k1, d.h1(), d.w1(), d.k2, d.stride2, d.h2(), d.w2(), kConv2W,
                da2_.data(), da1_.data());
  mark(kConv2W);
  relu_mask(da1_, a1_);
  conv_backward(x_.data(), d.channels, d.height, d.width, d.k1, d.stride1, d.h1(), d.w1(),
                kConv1W, da1_.data(), nullptr);
  mark(kConv1W);
}

template class HostCnn<float>;
template class HostCnn<double>;

namespace {

// The CPU backend: HostCnn<float> with host tensors (the reducer then
// all-reduces over MPI).
class CpuModel final : public Model {
 public:
  explicit CpuModel(const Dims& d) : net_(d) {}
  const Dims& dims() const override { return net_.dims(); }
  const ParamLayout& layout() const override { return net_.layout(); }
  tutti::Tensor param(int i) override { return view(net_.params(), i); }
  tutti::Tensor grad(int i) override { return view(net_.grads(), i); }
  void* stream() override { return nullptr; }
  void set_params(const std::vector<float>& flat) override {
    std::copy(flat.begin(), flat.end(), net_.params().begin());
  }
  std::vector<float> params_host() override { return net_.params(); }
  std::vector<float> grads_host() override { return net_.grads(); }
  void forward_backward(const Batch& batch, const std::function<void(int)>& ready) override {
    loss_ = net_.forward(batch.x.data(), batch.labels.data());
    net_.backward(ready);
  }
  void sgd_step(float lr) override {
    std::vector<float>& w = net_.params();
    const std::vector<float>& g = net_.grads();
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
  }
  double loss() override { return loss_; }
  std::string describe() const override { return "cpu (host tensors, im2col + loops)"; }

 private:
  tutti::Tensor view(std::vector<float>& flat, int i) const {
    const ParamSlot& s = net_.layout().slots[i];
    return tutti::Tensor(flat.data() + s.offset, tutti::DType::kFloat32, tutti::Shape(s.shape),
                         tutti::Device::cpu());
  }
  HostCnn<float> net_;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_cpu_model(const Dims& d) { return std::make_unique<CpuModel>(d); }

}  // namespace gpu_cnn
