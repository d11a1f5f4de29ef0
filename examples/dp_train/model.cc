#include "model.h"

#include <cmath>
#include <random>

namespace demo {

Task::Task(int inputs, int classes, uint64_t seed)
    : inputs_(inputs), classes_(classes), seed_(seed),
      teacher_(static_cast<size_t>(inputs) * classes) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& t : teacher_) t = nd(rng);
}

namespace {
// splitmix64: decorrelates the per-sample seeds of neighbouring indices.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

void Task::batch(int64_t first, int n, std::vector<float>* x, std::vector<int>* y) const {
  x->resize(static_cast<size_t>(n) * inputs_);
  y->resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    // One generator per sample, seeded by its global index alone.
    std::mt19937_64 rng(mix(seed_ * 0x100000001b3ull ^ static_cast<uint64_t>(first + s)));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    float* xs = x->data() + static_cast<size_t>(s) * inputs_;
    for (int i = 0; i < inputs_; ++i) xs[i] = nd(rng);
    int best = 0;
    float best_v = -1e30f;
    for (int c = 0; c < classes_; ++c) {
      float v = 0;
      for (int i = 0; i < inputs_; ++i) v += teacher_[static_cast<size_t>(c) * inputs_ + i] * xs[i];
      if (v > best_v) best_v = v, best = c;
    }
    (*y)[static_cast<size_t>(s)] = best;
  }
}

Mlp::Mlp(const std::vector<int>& widths, uint64_t seed) : widths_(widths) {
  std::mt19937_64 rng(seed);
  for (int l = 0; l < num_layers(); ++l) {
    const int in = widths_[l], out = widths_[l + 1];
    std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / static_cast<float>(in)));
    std::vector<float> w(static_cast<size_t>(in) * out), b(static_cast<size_t>(out), 0.0f);
    for (float& v : w) v = nd(rng);
    master_.push_back(std::move(w));
    master_.push_back(std::move(b));
  }
  for (const auto& m : master_) {
    model_.emplace_back(m.size());
    grad_.emplace_back(m.size());
    master_grad_.emplace_back(m.size(), 0.0f);
    momentum_.emplace_back(m.size(), 0.0f);
  }
  refresh_model();
}

std::string Mlp::name(int p) const {
  return "layer" + std::to_string(p / 2) + (p % 2 ? ".bias" : ".weight");
}

tutti::Shape Mlp::shape(int p) const {
  const int l = p / 2;
  if (p % 2) return tutti::Shape{widths_[l + 1]};
  return tutti::Shape{widths_[l + 1], widths_[l]};
}

void Mlp::refresh_model() {
  for (size_t p = 0; p < master_.size(); ++p)
    tutti::convert(master_[p].data(), tutti::DType::kFloat32, model_[p].data(),
                   tutti::DType::kFloat16, master_[p].size());
}

float Mlp::forward_backward_impl(const float* x, const int* y, int n,
                                 float loss_scale, void (*ready)(void*, int),
                                 void* ctx) {
  const int L = num_layers();
  // float32 views of the float16 weights.
  w_.resize(master_.size());
  for (size_t p = 0; p < master_.size(); ++p) {
    w_[p].resize(master_[p].size());
    tutti::convert(model_[p].data(), tutti::DType::kFloat16, w_[p].data(),
                   tutti::DType::kFloat32, w_[p].size());
  }
  acts_.resize(static_cast<size_t>(L) + 1);
  acts_[0].assign(x, x + static_cast<size_t>(n) * widths_[0]);
  for (int l = 0; l < L; ++l) {
    const int in = widths_[l], out = widths_[l + 1];
    const std::vector<float>& W = w_[2 * l];
    const std::vector<float>& B = w_[2 * l + 1];
    std::vector<float>& a = acts_[l + 1];
    a.assign(static_cast<size_t>(n) * out, 0.0f);
    for (int s = 0; s < n; ++s) {
      const float* xin = acts_[l].data() + static_cast<size_t>(s) * in;
      float* o = a.data() + static_cast<size_t>(s) * out;
      for (int j = 0; j < out; ++j) {
        const float* wr = W.data() + static_cast<size_t>(j) * in;
        float v = B[j];
        for (int i = 0; i < in; ++i) v += wr[i] * xin[i];
        o[j] = (l + 1 < L) ? std::max(v, 0.0f) : v;  // ReLU except the logits
      }
    }
  }
  // Softmax cross-entropy; delta = d(mean loss)/d logits.
  const int C = widths_.back();
  std::vector<float> delta(static_cast<size_t>(n) * C);
  double loss = 0;
  for (int s = 0; s < n; ++s) {
    const float* z = acts_[L].data() + static_cast<size_t>(s) * C;
    float m = z[0];
    for (int c = 1; c < C; ++c) m = std::max(m, z[c]);
    double sum = 0;
    for (int c = 0; c < C; ++c) sum += std::exp(static_cast<double>(z[c] - m));
    loss += std::log(sum) + m - z[y[s]];
    for (int c = 0; c < C; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - m)) / sum;
      delta[static_cast<size_t>(s) * C + c] =
          static_cast<float>((p - (c == y[s] ? 1.0 : 0.0)) / n);
    }
  }
  // Backward, last layer first; gradients of the scaled loss in float16.
  std::vector<float> gw, gb, prev;
  for (int l = L - 1; l >= 0; --l) {
    const int in = widths_[l], out = widths_[l + 1];
    gw.assign(static_cast<size_t>(in) * out, 0.0f);
    gb.assign(static_cast<size_t>(out), 0.0f);
    for (int s = 0; s < n; ++s) {
      const float* d = delta.data() + static_cast<size_t>(s) * out;
      const float* xin = acts_[l].data() + static_cast<size_t>(s) * in;
      for (int j = 0; j < out; ++j) {
        gb[j] += d[j];
        float* g = gw.data() + static_cast<size_t>(j) * in;
        for (int i = 0; i < in; ++i) g[i] += d[j] * xin[i];
      }
    }
    if (l > 0) {
      prev.assign(static_cast<size_t>(n) * in, 0.0f);
      const std::vector<float>& W = w_[2 * l];
      for (int s = 0; s < n; ++s) {
        const float* d = delta.data() + static_cast<size_t>(s) * out;
        float* pv = prev.data() + static_cast<size_t>(s) * in;
        const float* a = acts_[l].data() + static_cast<size_t>(s) * in;
        for (int j = 0; j < out; ++j) {
          const float* wr = W.data() + static_cast<size_t>(j) * in;
          for (int i = 0; i < in; ++i) pv[i] += d[j] * wr[i];
        }
        for (int i = 0; i < in; ++i) if (a[i] <= 0.0f) pv[i] = 0.0f;  // ReLU'
      }
    }
    // float16(scale * g): overflows to Inf when the scale is too large.
    for (float& v : gb) v *= loss_scale;
    for (float& v : gw) v *= loss_scale;
    tutti::convert(gb.data(), tutti::DType::kFloat32, grad_[2 * l + 1].data(),
                   tutti::DType::kFloat16, gb.size());
    ready(ctx, 2 * l + 1);
    tutti::convert(gw.data(), tutti::DType::kFloat32, grad_[2 * l].data(),
                   tutti::DType::kFloat16, gw.size());
    ready(ctx, 2 * l);
    delta.swap(prev);
  }
  return static_cast<float>(loss / n);
}

void Mlp::sgd_step(float lr, float mu) {
  for (size_t p = 0; p < master_.size(); ++p) {
    std::vector<float>& w = master_[p];
    std::vector<float>& g = master_grad_[p];
    std::vector<float>& v = momentum_[p];
    for (size_t i = 0; i < w.size(); ++i) {
      v[i] = mu * v[i] + g[i];
      w[i] -= lr * v[i];
    }
  }
  refresh_model();
}

uint64_t Mlp::hash() const {
  uint64_t h = 1469598103934665603ull;
  for (const auto& m : master_) {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(m.data());
    for (size_t i = 0; i < m.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace demo
