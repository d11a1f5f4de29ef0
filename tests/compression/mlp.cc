#include "compression/mlp.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/gemm.h"
#include "tutti/data_parallel.h"

namespace tutti {
namespace test {

void TeacherTask::batch(uint64_t stream, int64_t b, std::vector<float>* x,
                        std::vector<int32_t>* y) const {
  // The teacher's weights depend on `seed` only.
  std::mt19937_64 trng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(classes * inputs));
  for (auto& v : w) v = normal(trng);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + stream + 1);
  x->resize(static_cast<size_t>(b * inputs));
  y->resize(static_cast<size_t>(b));
  for (auto& v : *x) v = normal(rng);
  for (int64_t i = 0; i < b; ++i) {
    int32_t best = 0;
    float best_v = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) {
      float s = 0;
      for (int64_t k = 0; k < inputs; ++k) s += w[c * inputs + k] * (*x)[i * inputs + k];
      if (s > best_v) best_v = s, best = static_cast<int32_t>(c);
    }
    (*y)[i] = best;
  }
}

Mlp::Mlp(const std::vector<int64_t>& sizes, uint64_t seed) : sizes_(sizes) {
  int64_t total = 0;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    const int64_t in = sizes[l], out = sizes[l + 1];
    layout_.push_back({"fc" + std::to_string(l) + ".weight", total, Shape{out, in}});
    total += out * in;
    layout_.push_back({"fc" + std::to_string(l) + ".bias", total, Shape{out}});
    total += out;
  }
  params_.assign(static_cast<size_t>(total), 0.0f);
  grads_.assign(params_.size(), 0.0f);
  velocity_.assign(params_.size(), 0.0f);
  std::mt19937_64 rng(seed);
  for (const Param& p : layout_) {
    if (p.shape.ndim() != 2) continue;  // biases start at zero
    std::normal_distribution<float> d(0.0f, std::sqrt(2.0f / p.shape[1]));
    for (int64_t i = 0; i < p.shape.numel(); ++i) params_[p.offset + i] = d(rng);
  }
}

float Mlp::forward(const float* x, const int32_t* y, int64_t b, bool backward) {
  const size_t layers = sizes_.size() - 1;
  acts_.resize(layers + 1);
  acts_[0].assign(x, x + b * sizes_[0]);
  for (size_t l = 0; l < layers; ++l) {
    const int64_t in = sizes_[l], out = sizes_[l + 1];
    const Param& w = layout_[2 * l];
    const Param& bias = layout_[2 * l + 1];
    std::vector<float>& z = acts_[l + 1];
    z.assign(static_cast<size_t>(b * out), 0.0f);
    blas::gemm(Tensor(acts_[l].data(), DType::kFloat32, Shape{b, in}), false,
               Tensor(params_.data() + w.offset, DType::kFloat32, Shape{out, in}), true,
               Tensor(z.data(), DType::kFloat32, Shape{b, out}));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < out; ++j) {
        float& v = z[i * out + j];
        v += params_[bias.offset + j];
        if (l + 1 < layers) v = std::max(v, 0.0f);
      }
  }
  // Softmax cross-entropy on the logits; dz = (softmax - onehot) / b.
  const int64_t c = sizes_.back();
  const std::vector<float>& logits = acts_[layers];
  dz_.assign(static_cast<size_t>(b * c), 0.0f);
  double loss = 0;
  for (int64_t i = 0; i < b; ++i) {
    const float* zi = logits.data() + i * c;
    const float mx = *std::max_element(zi, zi + c);
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(zi[j] - mx));
    loss += std::log(s) - (zi[y[i]] - mx);
    for (int64_t j = 0; j < c; ++j)
      dz_[i * c + j] = static_cast<float>(std::exp(zi[j] - mx) / s - (j == y[i] ? 1.0 : 0.0)) /
                       static_cast<float>(b);
  }
  if (!backward) return static_cast<float>(loss / b);
  for (size_t l = layers; l-- > 0;) {
    const int64_t in = sizes_[l], out = sizes_[l + 1];
    const Param& w = layout_[2 * l];
    const Param& bias = layout_[2 * l + 1];
    blas::gemm(Tensor(dz_.data(), DType::kFloat32, Shape{b, out}), true,
               Tensor(acts_[l].data(), DType::kFloat32, Shape{b, in}), false,
               Tensor(grads_.data() + w.offset, DType::kFloat32, Shape{out, in}));
    for (int64_t j = 0; j < out; ++j) {
      float s = 0;
      for (int64_t i = 0; i < b; ++i) s += dz_[i * out + j];
      grads_[bias.offset + j] = s;
    }
    if (l == 0) break;
    dh_.assign(static_cast<size_t>(b * in), 0.0f);
    blas::gemm(Tensor(dz_.data(), DType::kFloat32, Shape{b, out}), false,
               Tensor(params_.data() + w.offset, DType::kFloat32, Shape{out, in}), false,
               Tensor(dh_.data(), DType::kFloat32, Shape{b, in}));
    for (int64_t i = 0; i < b * in; ++i)
      if (acts_[l][i] <= 0.0f) dh_[i] = 0.0f;  // ReLU of the layer below
    dz_.swap(dh_);
  }
  return static_cast<float>(loss / b);
}

void Mlp::sgd_step(float lr, float momentum) {
  for (size_t i = 0; i < params_.size(); ++i) {
    velocity_[i] = momentum * velocity_[i] + grads_[i];
    params_[i] -= lr * velocity_[i];
  }
}

TrainResult train(std::shared_ptr<Compressor> compressor,
                  const ProcessGroupPtr& group, const TrainOptions& o) {
  Communicator& comm = *group;
  Mlp model(o.sizes, o.seed);
  TeacherTask task;
  task.inputs = o.sizes.front();
  task.classes = o.sizes.back();
  task.seed = o.seed + 1;
  ReducerOptions ro;
  ro.bucket_cap_mb = static_cast<double>(o.bucket_cap_bytes) / (1 << 20);
  ro.first_bucket_cap_mb = 0;  // every bucket at the same cap
  ro.compressor = std::move(compressor);
  ro.hierarchical = false;
  Reducer reducer(group, ro);
  const auto& layout = model.layout();
  for (const auto& p : layout)
    reducer.add_parameter(p.name,
                          Tensor(model.params() + p.offset, DType::kFloat32, p.shape),
                          Tensor(model.grads() + p.offset, DType::kFloat32, p.shape));
  reducer.build();
  TrainResult r;
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t step = 0; step < o.steps; ++step) {
    task.batch(static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(comm.rank()),
               o.batch, &x, &y);
    float loss = model.forward(x.data(), y.data(), o.batch, true);
    // Last layer first, as autograd would report them.
    for (int i = static_cast<int>(layout.size()) - 1; i >= 0; --i) reducer.grad_ready(i);
    reducer.synchronize();
    const float lr = o.lr_decay ? o.lr * (1.0f - static_cast<float>(step) /
                                                   static_cast<float>(o.steps))
                                : o.lr;
    model.sgd_step(lr, o.momentum);
    comm.allreduce(Tensor::of(&loss, 1), ReduceOp::kAvg);
    r.train_loss.push_back(loss);
    if (o.on_step && o.on_step(step, loss)) break;
  }
  if (o.eval_samples > 0) {
    task.batch(~0ull, o.eval_samples, &x, &y);  // the same on every rank
    r.final_eval_loss = model.forward(x.data(), y.data(), o.eval_samples, false);
  }
  r.final_params.assign(model.params(), model.params() + model.num_params());
  return r;
}

}  // namespace test
}  // namespace tutti
