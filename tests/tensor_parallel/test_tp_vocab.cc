// VocabParallelEmbedding and VocabParallelCrossEntropy against dense float64
// references, at every tp_size the world allows.
//
// Embedding forward is a row copy plus zeros from the other ranks: exact.
// Its gradient adds the output-gradient rows of repeated ids: near_dense.
// Cross-entropy is computed in float32: exp and log are within a few ulp, so
// the sum of V exponentials is within (V + 2) u relative and
// log S - t within (V + 8) u (1 + |t| + |log S|) absolute, the bound used
// below (u = 2^-24).  The gradient softmax - onehot is within (V + 8) u of
// the reference before the 1/count scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::view;

constexpr int64_t kVocab = 24;  // divisible by 1, 2, 3 and 4
const double kU = std::ldexp(1.0, -24);

std::vector<int64_t> some_ids(int64_t n, uint64_t seed) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = static_cast<int64_t>((i * 7 + seed * 5) % kVocab);
  if (n > 1) {
    ids[0] = 0;               // first row of rank 0's shard
    ids[n - 1] = kVocab - 1;  // last row of the last rank's shard
  }
  if (n > 3) ids[2] = ids[1];  // a repeated id: its gradients add up
  return ids;
}

TEST(VocabParallelEmbedding, LookupAndGradientMatchDense) {
  const int64_t dim = 5;
  for (const auto& mesh : tptest::all_meshes())
    for (int64_t n : {1, 3, 7, 0})
      for (DType index : {DType::kInt64, DType::kInt32}) {
        SCOPED_TRACE(
            detail::cat(mesh->str(), " n ", n, " ", dtype_name(index)));
        const int p = mesh->tp_size(), r = mesh->tp_rank();
        auto table = tptest::random_floats(31, kVocab * dim),
             dy = tptest::random_floats(32, n * dim);
        const auto ids64 = some_ids(n, 3);
        std::vector<int32_t> ids32(ids64.begin(), ids64.end());
        const Tensor ids =
            index == DType::kInt64
                ? Tensor(const_cast<int64_t*>(ids64.data()), index, Shape{n})
                : Tensor(ids32.data(), index, Shape{n});
        VocabParallelEmbeddingOptions o;
        o.name = "wte";
        VocabParallelEmbedding emb(mesh, kVocab, dim, o);
        EXPECT_EQ(emb.vocab_per_rank(), kVocab / p);
        EXPECT_EQ(emb.vocab_start(), r * kVocab / p);
        emb.load_from_full(view(table, {kVocab, dim}));
        std::vector<float> y(n * dim, std::nanf(""));
        emb.forward(ids, view(y, {n, dim}));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t h = 0; h < dim; ++h)
            ASSERT_EQ(y[i * dim + h], table[ids64[i] * dim + h]) << "row " << i;
        emb.backward(ids, view(dy, {n, dim}));
        tptest::Dense ref;
        ref.value.assign(kVocab * dim, 0.0);
        ref.magnitude.assign(kVocab * dim, 0.0);
        ref.terms = std::max<int64_t>(n, 1);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t h = 0; h < dim; ++h) {
            ref.value[ids64[i] * dim + h] += dy[i * dim + h];
            ref.magnitude[ids64[i] * dim + h] += std::fabs(dy[i * dim + h]);
          }
        const int64_t v0 = r * kVocab / p, v1 = v0 + kVocab / p;
        EXPECT_TRUE(tptest::near_dense(tptest::read(emb.weight_grad()),
                                       tptest::rows_of(ref, dim, v0, v1)));
      }
}

TEST(VocabParallelEmbedding, SequenceParallelOutputIsThisRanksSequenceSlice) {
  const int64_t dim = 3, batch = 3;
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size(), r = mesh->tp_rank();
    const int64_t seq = 2 * p, n = seq * batch, local = n / p;
    auto table = tptest::random_floats(41, kVocab * dim),
         dy_local = tptest::random_floats(42 + r, local * dim);
    auto ids = some_ids(n, 5);
    VocabParallelEmbeddingOptions o;
    o.sequence_parallel = true;
    VocabParallelEmbedding emb(mesh, kVocab, dim, o);
    emb.load_from_full(view(table, {kVocab, dim}));
    std::vector<float> y(local * dim, std::nanf(""));
    const Tensor t_ids(ids.data(), DType::kInt64, Shape{seq, batch});
    emb.forward(t_ids, view(y, {seq / p, batch, dim}));
    for (int64_t i = 0; i < local; ++i)
      for (int64_t h = 0; h < dim; ++h)
        ASSERT_EQ(y[i * dim + h], table[ids[r * local + i] * dim + h])
            << "row " << i;
    // Backward all-gathers the gradient rows of every rank: rebuild them.
    std::vector<float> dy_all(n * dim);
    for (int q = 0; q < p; ++q) {
      auto part = tptest::random_floats(42 + q, local * dim);
      std::copy(part.begin(), part.end(), dy_all.begin() + q * local * dim);
    }
    emb.backward(t_ids, view(dy_local, {seq / p, batch, dim}));
    std::vector<double> ref(kVocab * dim, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < dim; ++h)
        ref[ids[i] * dim + h] += dy_all[i * dim + h];
    const int64_t v0 = r * kVocab / p;
    std::vector<double> mine(ref.begin() + v0 * dim,
                             ref.begin() + (v0 + kVocab / p) * dim);
    EXPECT_TRUE(
        tptest::near(tptest::read(emb.weight_grad()), mine, 8 * n * kU));
  }
}

TEST(VocabParallelEmbedding, HostIdsOutsideTheVocabularyAreErrors) {
  for (const auto& mesh : tptest::all_meshes()) {
    VocabParallelEmbeddingOptions o;
    o.name = "wte";
    VocabParallelEmbedding emb(mesh, kVocab, 2, o);
    std::vector<int64_t> ids{1, kVocab, 2};
    std::vector<float> y(6);
    tptest::expect_error(
        [&] {
          emb.forward(Tensor(ids.data(), DType::kInt64, Shape{3}),
                      view(y, {3, 2}));
        },
        ErrorCode::kInvalidArgument,
        {"VocabParallelEmbedding 'wte' forward", "id 24 at position 1",
         "[0, 24)"});
    tptest::expect_error(
        [&] {
          emb.forward(view(y, {6}), view(y, {6, 2}));
        },
        ErrorCode::kInvalidArgument, {"int32 or int64"});
  }
}

// Dense float64 cross-entropy over the full logits [n, V].
struct DenseCE {
  std::vector<double> loss, grad, bound;
  double mean = 0;
  int64_t count = 0;
};

DenseCE dense_ce(const std::vector<float>& z, const std::vector<int64_t>& t,
                 int64_t n, int64_t ignore) {
  DenseCE d;
  d.loss.assign(n, 0.0);
  d.bound.assign(n, 0.0);
  d.grad.assign(n * kVocab, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kVocab; ++j)
      m = std::max(m, static_cast<double>(z[i * kVocab + j]));
    double s = 0;
    for (int64_t j = 0; j < kVocab; ++j) s += std::exp(z[i * kVocab + j] - m);
    const double tl = z[i * kVocab + t[i]] - m;
    d.loss[i] = std::log(s) - tl;
    d.bound[i] =
        (kVocab + 8) * kU * (1 + std::fabs(tl) + std::fabs(std::log(s)));
    for (int64_t j = 0; j < kVocab; ++j)
      d.grad[i * kVocab + j] =
          std::exp(z[i * kVocab + j] - m) / s - (j == t[i] ? 1.0 : 0.0);
    d.mean += d.loss[i];
    ++d.count;
  }
  if (d.count > 0) {
    d.mean /= d.count;
    for (auto& g : d.grad) g /= d.count;
  }
  return d;
}

void check_cross_entropy(const ProcessMeshPtr& mesh,
                         const std::vector<float>& z,
                         const std::vector<int64_t>& t, int64_t n,
                         float grad_scale, bool in_place) {
  const int p = mesh->tp_size(), r = mesh->tp_rank();
  const int64_t vl = kVocab / p;
  VocabParallelCrossEntropyOptions o;
  o.name = "lm_loss";
  VocabParallelCrossEntropy ce(mesh, kVocab, o);
  auto z_local = tptest::cols_of(z, n, kVocab, r * vl, (r + 1) * vl);
  std::vector<float> losses(n, std::nanf("")), mean(1, std::nanf(""));
  std::vector<int64_t> targets = t;
  const Tensor tt(targets.data(), DType::kInt64, Shape{n});
  ce.forward(view(z_local, {n, vl}), tt, view(losses, {n}), view(mean, {1}));
  const DenseCE ref = dense_ce(z, t, n, o.ignore_index);
  double mean_bound = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(losses[i] - ref.loss[i]), ref.bound[i] + 1e-30)
        << "row " << i << ": " << losses[i] << " vs " << ref.loss[i];
    mean_bound = std::max(mean_bound, ref.bound[i]);
  }
  EXPECT_LE(std::fabs(mean[0] - ref.mean), 2 * mean_bound + 1e-30)
      << mean[0] << " vs " << ref.mean;
  std::vector<float> g =
      in_place ? z_local : std::vector<float>(n * vl, std::nanf(""));
  ce.backward(view(z_local, {n, vl}), tt, view(in_place ? z_local : g, {n, vl}),
              grad_scale);
  if (in_place) g = z_local;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < vl; ++j) {
      const double e = grad_scale * ref.grad[i * kVocab + r * vl + j];
      const double tol = (kVocab + 8) * kU * std::fabs(grad_scale) /
                         std::max<int64_t>(ref.count, 1);
      ASSERT_LE(std::fabs(g[i * vl + j] - e), tol + 1e-30)
          << "grad row " << i << " col " << j;
    }
}

TEST(VocabParallelCrossEntropy, LossAndGradientMatchDense) {
  for (const auto& shared : tptest::all_meshes())
    for (int64_t n : {1, 3, 7}) {
      SCOPED_TRACE(detail::cat(shared->str(), " n ", n));
      auto z = tptest::random_floats(51 + n, n * kVocab, -3.0f, 3.0f);
      auto t = some_ids(n, 7);
      check_cross_entropy(shared, z, t, n, 1.0f, false);
      check_cross_entropy(shared, z, t, n, 0.5f, true);  // grad aliases logits
    }
}

TEST(VocabParallelCrossEntropy, IgnoreIndexAndAllIgnoredBatches) {
  for (const auto& shared : tptest::all_meshes()) {
    SCOPED_TRACE(shared->str());
    const int64_t n = 5;
    auto z = tptest::random_floats(61, n * kVocab, -2.0f, 2.0f);
    auto t = some_ids(n, 9);
    t[1] = -100;
    t[3] = -100;
    check_cross_entropy(shared, z, t, n, 1.0f, false);
    // Every token ignored: loss 0, mean 0, gradient 0 (not NaN).
    std::vector<int64_t> none(n, -100);
    check_cross_entropy(shared, z, none, n, 1.0f, false);
  }
}

TEST(VocabParallelCrossEntropy, LargeLogitsStayFinite) {
  for (const auto& shared : tptest::all_meshes()) {
    SCOPED_TRACE(shared->str());
    const int64_t n = 4;
    auto z = tptest::random_floats(71, n * kVocab, -1.0f, 1.0f);
    for (int64_t j = 0; j < kVocab; ++j) {
      z[0 * kVocab + j] += 1e4f;  // every logit large: exp(z) alone overflows
      z[1 * kVocab + j] -=
          1e4f;  // every logit very negative: exp(z) underflows
    }
    z[2 * kVocab + 17] = 3e4f;  // one logit dominates the row
    z[3 * kVocab + 2] =
        80.0f;  // exp(80) overflows float32 without the max shift
    auto t = some_ids(n, 11);
    t[2] = 5;  // the dominated target: loss ~ 3e4
    check_cross_entropy(shared, z, t, n, 1.0f, false);
  }
}

TEST(VocabParallelCrossEntropy, BadTargetsAndMissingForwardAreErrors) {
  for (const auto& shared : tptest::all_meshes()) {
    const int64_t vl = kVocab / shared->tp_size();
    VocabParallelCrossEntropyOptions o;
    o.name = "lm_loss";
    VocabParallelCrossEntropy ce(shared, kVocab, o);
    std::vector<float> z(2 * vl), loss(2), mean(1), g(2 * vl);
    std::vector<int64_t> t{3, kVocab + 1};
    const Tensor tt(t.data(), DType::kInt64, Shape{2});
    tptest::expect_error(
        [&] {
          ce.backward(view(z, {2, vl}), tt, view(g, {2, vl}));
        },
        ErrorCode::kInvalidArgument,
        {"'lm_loss' backward", "needs the forward"});
    tptest::expect_error(
        [&] {
          ce.forward(view(z, {2, vl}), tt, view(loss, {2}), view(mean, {1}));
        },
        ErrorCode::kInvalidArgument,
        {"'lm_loss' forward", "target 25 of row 1", "ignore_index -100"});
    t[1] = 1;
    tptest::expect_error(
        [&] {
          ce.forward(view(z, {2, vl}), tt, view(loss, {3}), view(mean, {1}));
        },
        ErrorCode::kInvalidArgument, {"losses", "2 elements"});
    // losses may be skipped.
    ce.forward(view(z, {2, vl}), tt, Tensor(), view(mean, {1}));
    EXPECT_NEAR(mean[0], std::log(static_cast<double>(kVocab)),
                1e-5);  // all-zero logits
  }
}

}  // namespace
}  // namespace tutti
