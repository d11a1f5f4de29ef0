// A two-layer MLP, y = fc2(tanh(fc1(x))) with fc1 column parallel and fc2
// row parallel, trained with SGD on an MSE loss for several steps on every
// TP x DP mesh the world allows (under -np 4: TP 2 x DP 2, and TP 1 x DP 4,
// TP 4 x DP 1), with and without sequence parallelism.  Gradients are
// averaged over the DP group with a plain all-reduce.  The result must equal
// dense single-process training on the full batch, computed here in float64.
//
// Tolerance: each float32 forward/backward is within the gamma_n bound of
// its GEMMs (n <= 24 terms, ~1.5e-6 relative to the magnitudes, which stay
// below 4 here); over kSteps SGD steps with lr 0.2 the parameter error grows
// by at most kSteps * lr * that per step, well below the 2e-5 allowed.  A TP
// or DP mistake (a missing all-reduce, a wrong slice, a sum instead of an
// average) changes the parameters by more than 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::view;

constexpr int64_t kH = 8, kF = 24;  // kF divisible by 1, 2, 3, 4
constexpr int kSteps = 6;
constexpr double kLr = 0.2;

// Float64 dense model and its full-batch SGD step.
struct DenseMlp {
  std::vector<double> w1, b1, w2, b2;  // [F, H], [F], [H, F], [H]

  // One step on x, t [b, H]; returns the loss before the update.
  double step(const std::vector<float>& x, const std::vector<float>& t,
              int64_t b) {
    std::vector<double> a(b * kF), y(b * kH), dy(b * kH), da(b * kF);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t f = 0; f < kF; ++f) {
        double s = b1[f];
        for (int64_t h = 0; h < kH; ++h) s += x[i * kH + h] * w1[f * kH + h];
        a[i * kF + f] = std::tanh(s);
      }
    double loss = 0;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t h = 0; h < kH; ++h) {
        double s = b2[h];
        for (int64_t f = 0; f < kF; ++f) s += a[i * kF + f] * w2[h * kF + f];
        y[i * kH + h] = s;
        const double e = s - t[i * kH + h];
        loss += e * e / (b * kH);
        dy[i * kH + h] = 2 * e / (b * kH);
      }
    std::vector<double> gw1(w1.size(), 0), gb1(b1.size(), 0), gw2(w2.size(), 0),
        gb2(b2.size(), 0);
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t h = 0; h < kH; ++h) {
        gb2[h] += dy[i * kH + h];
        for (int64_t f = 0; f < kF; ++f)
          gw2[h * kF + f] += dy[i * kH + h] * a[i * kF + f];
      }
      for (int64_t f = 0; f < kF; ++f) {
        double s = 0;
        for (int64_t h = 0; h < kH; ++h) s += dy[i * kH + h] * w2[h * kF + f];
        const double dh = s * (1 - a[i * kF + f] * a[i * kF + f]);
        gb1[f] += dh;
        for (int64_t h = 0; h < kH; ++h) gw1[f * kH + h] += dh * x[i * kH + h];
      }
    }
    auto sgd = [](std::vector<double>& p, const std::vector<double>& g) {
      for (size_t k = 0; k < p.size(); ++k) p[k] -= kLr * g[k];
    };
    sgd(w1, gw1);
    sgd(b1, gb1);
    sgd(w2, gw2);
    sgd(b2, gb2);
    return loss;
  }
};

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

void train_and_compare(const ProcessMeshPtr& mesh, bool sp) {
  const int p = mesh->tp_size(), d = mesh->dp_size();
  const int tr = mesh->tp_rank(), dr = mesh->dp_rank();
  // Odd local batches: 3 rows per replica, or with sequence parallelism 3
  // rows per TP rank.
  const int64_t local = sp ? 3 * p : 3, batch = local * d;
  const auto x = tptest::random_floats(101, batch * kH, -1.0f, 1.0f);
  const auto t = tptest::random_floats(102, batch * kH, -0.5f, 0.5f);
  auto w1 = tptest::random_floats(103, kF * kH, -0.5f, 0.5f),
       b1 = tptest::random_floats(104, kF, -0.1f, 0.1f),
       w2 = tptest::random_floats(105, kH * kF, -0.5f, 0.5f),
       b2 = tptest::random_floats(106, kH, -0.1f, 0.1f);
  DenseMlp dense{widen(w1), widen(b1), widen(w2), widen(b2)};

  ColumnParallelLinearOptions co;
  co.name = "fc1";
  co.gather_output = false;
  co.sequence_parallel = sp;
  RowParallelLinearOptions ro;
  ro.name = "fc2";
  ro.input_is_parallel = true;
  ro.sequence_parallel = sp;
  ColumnParallelLinear fc1(mesh, kH, kF, co);
  RowParallelLinear fc2(mesh, kF, kH, ro);
  fc1.load_from_full(view(w1, {kF, kH}), view(b1, {kF}));
  fc2.load_from_full(view(w2, {kH, kF}), view(b2, {kH}));

  // This rank's rows: the replica's slice of the batch, and under sequence
  // parallelism this TP rank's slice of that.
  const int64_t own = sp ? local / p : local;
  const int64_t r0 = dr * local + (sp ? tr * own : 0);
  auto x_own = tptest::rows_of(x, kH, r0, r0 + own);
  auto t_own = tptest::rows_of(t, kH, r0, r0 + own);
  std::vector<float> h(local * kF / p), y(own * kH), dy(own * kH),
      da(local * kF / p);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    fc1.forward(view(x_own, {own, kH}), view(h, {local, kF / p}));
    for (float& v : h) v = std::tanh(v);  // h now holds the activation a
    fc2.forward(view(h, {local, kF / p}), view(y, {own, kH}));
    // MSE over the replica's local batch: dL/dy = 2 (y - t) / (local H).
    double sse = 0;
    for (int64_t k = 0; k < own * kH; ++k) {
      const double e = y[k] - t_own[k];
      sse += e * e;
      dy[k] = static_cast<float>(2 * e / (local * kH));
    }
    fc2.backward(view(h, {local, kF / p}), view(dy, {own, kH}),
                 view(da, {local, kF / p}));
    for (size_t k = 0; k < da.size(); ++k) da[k] *= 1 - h[k] * h[k];  // tanh'
    fc1.backward(view(x_own, {own, kH}), view(da, {local, kF / p}), Tensor());
    // The replica's loss: rows are split over TP only with SP; then the mean
    // over replicas.
    if (sp) mesh->tp_group()->allreduce(Tensor::of(&sse, 1));
    double loss = sse / (local * kH);
    mesh->dp_group()->allreduce(Tensor::of(&loss, 1), ReduceOp::kAvg);
    const double want_loss = dense.step(x, t, batch);
    EXPECT_NEAR(loss, want_loss, 2e-6 * std::max(1.0, want_loss));
    // Data parallel: average every gradient over the replicas, then SGD.
    for (TensorParallelLinear* layer :
         {static_cast<TensorParallelLinear*>(&fc1),
          static_cast<TensorParallelLinear*>(&fc2)}) {
      for (const TPParameter& prm : layer->parameters()) {
        mesh->dp_group()->allreduce(prm.grad, ReduceOp::kAvg,
                                    OpOptions{prm.name});
        float* v = prm.value.data_as<float>();
        const float* g = prm.grad.data_as<float>();
        for (int64_t k = 0; k < prm.value.numel(); ++k)
          v[k] -= static_cast<float>(kLr) * g[k];
      }
      layer->zero_grad();
    }
  }
  // Final parameters, reassembled from the shards, against the dense model.
  const StateDict s1 = fc1.state_dict(), s2 = fc2.state_dict();
  const std::vector<double>* want[] = {&dense.w1, &dense.b1, &dense.w2,
                                       &dense.b2};
  const NamedTensor* got[] = {&s1[0], &s1[1], &s2[0], &s2[1]};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(tptest::near(tptest::assemble(*mesh, *got[i]), *want[i], 2e-5))
        << got[i]->name;
    // Replicas apply the same averaged gradients: bit-identical shards.
    std::vector<float> lo = tptest::read(got[i]->tensor), hi = lo;
    mesh->dp_group()->allreduce(Tensor::of(lo), ReduceOp::kMin);
    mesh->dp_group()->allreduce(Tensor::of(hi), ReduceOp::kMax);
    EXPECT_EQ(lo, hi) << got[i]->name << " differs between DP replicas";
  }
  // Training did something: the dense weights moved well beyond the tolerance.
  double moved = 0;
  for (size_t k = 0; k < w2.size(); ++k)
    moved = std::max(moved, std::fabs(dense.w2[k] - w2[k]));
  EXPECT_GT(moved, 1e-2);
}

TEST(MlpTraining, TensorTimesDataParallelEqualsDenseTraining) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    train_and_compare(mesh, false);
  }
}

TEST(MlpTraining, SequenceParallelTrainingEqualsDenseTraining) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str() + " sequence parallel");
    train_and_compare(mesh, true);
  }
}

}  // namespace
}  // namespace tutti
