// Global-norm clipping: a tensor split across the ranks of a model-parallel
// group (unequal shards, some empty) plus replicated tensors gives exactly
// the unsplit norm on every rank; clipping scales by the closed-form
// coefficient.  Run under mpiexec -np 1..4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "amp_test_util.h"

namespace tutti {
namespace amp {
namespace {

using test::HostTensor;

// Values k/4 with |k| <= 12: squares and every float32 partial sum are
// exact, so the norm has a closed form that the kernels must hit exactly.
float global_value(int64_t i) { return static_cast<float>((i * 5) % 25 - 12) / 4.0f; }
float bias_value(int64_t i) { return static_cast<float>(i % 7 - 3) / 4.0f; }

// Rank r of p holds [begin, end) of n: shard r gets a share ~ (r + 1).
void shard_range(int64_t n, int p, int r, int64_t* begin, int64_t* end) {
  const int64_t total = static_cast<int64_t>(p) * (p + 1) / 2;
  *begin = n * (static_cast<int64_t>(r) * (r + 1) / 2) / total;
  *end = n * (static_cast<int64_t>(r + 1) * (r + 2) / 2) / total;
}

struct Model {
  HostTensor weight_shard, bias;  // bias replicated on every rank
  double expected_sq = 0;         // unsplit sum of squares
  Model(DType d, int64_t n, int64_t n_bias, int p, int r)
      : weight_shard(d, 0), bias(d, n_bias) {
    int64_t b, e;
    shard_range(n, p, r, &b, &e);
    weight_shard = HostTensor(d, e - b);
    for (int64_t i = b; i < e; ++i) weight_shard.set(i - b, global_value(i));
    for (int64_t i = 0; i < n; ++i) expected_sq += std::pow(global_value(i), 2.0);
    for (int64_t i = 0; i < n_bias; ++i) {
      bias.set(i, bias_value(i));
      expected_sq += std::pow(bias_value(i), 2.0);
    }
  }
  std::vector<Tensor> grads() { return {weight_shard.tensor(), bias.tensor()}; }
};

const int64_t kWeightSizes[] = {0, 1, 7, 1001, 3 * 65536 + 17};

TEST(ClipGradNorm, ShardedNormEqualsUnsplitNormExactly) {
  ProcessGroupPtr w = world();
  for (DType d : test::kAmpDTypes) {
    for (int64_t n : kWeightSizes) {
      Model m(d, n, 37, w->size(), w->rank());
      ClipOptions o;
      o.group = w.get();
      o.replicated = {false, true};
      EXPECT_EQ(grad_norm(m.grads(), o), std::sqrt(m.expected_sq))
          << dtype_name(d) << " n " << n;
    }
  }
}

TEST(ClipGradNorm, ReplicatedTensorsCountOnceShardedOnesSum) {
  ProcessGroupPtr w = world();
  const int p = w->size();
  Model m(DType::kFloat32, 5000, 64, p, w->rank());
  double bias_sq = 0;
  for (int64_t i = 0; i < 64; ++i) bias_sq += std::pow(bias_value(i), 2.0);
  ClipOptions o;
  o.group = w.get();
  // Marking the bias sharded counts it once per rank: p copies in total.
  o.replicated = {false, false};
  EXPECT_EQ(grad_norm(m.grads(), o), std::sqrt(m.expected_sq + (p - 1) * bias_sq));
  // Without a group the norm is this rank's tensors alone.
  double local_sq = bias_sq;
  for (int64_t i = 0; i < m.weight_shard.numel(); ++i)
    local_sq += std::pow(m.weight_shard.get(i), 2.0);
  EXPECT_EQ(grad_norm(m.grads(), ClipOptions{}), std::sqrt(local_sq));
}

TEST(ClipGradNorm, SplitGroupsOfAMesh) {
  // Tensor-parallel pairs (rank / 2); each pair shards the same weight.
  ProcessGroupPtr w = world();
  auto tp = w->split_group(w->rank() / 2, w->rank(), "tp");
  Model m(DType::kBFloat16, 4099, 5, tp->size(), tp->rank());
  ClipOptions o;
  o.group = tp.get();
  o.replicated = {false, true};
  EXPECT_EQ(grad_norm(m.grads(), o), std::sqrt(m.expected_sq));
}

TEST(ClipGradNorm, ClipsByTheClosedFormCoefficient) {
  ProcessGroupPtr w = world();
  for (DType d : test::kAmpDTypes) {
    Model m(d, 70001, 37, w->size(), w->rank());
    const HostTensor w0 = m.weight_shard, b0 = m.bias;
    ClipOptions o;
    o.group = w.get();
    o.replicated = {false, true};
    const double norm = std::sqrt(m.expected_sq);
    const double max_norm = norm / 3;
    const ClipResult r = clip_grad_norm(m.grads(), max_norm, o);
    EXPECT_EQ(r.total_norm, norm);
    EXPECT_TRUE(r.clipped);
    EXPECT_FALSE(r.non_finite);
    const double coef = max_norm / (norm + 1e-6);
    EXPECT_EQ(r.clip_coef, coef);
    const float c = static_cast<float>(coef);
    for (int64_t i = 0; i < w0.numel(); ++i) {
      HostTensor e(d, 1);
      e.set(0, w0.get(i) * c);
      ASSERT_EQ(m.weight_shard.bits(i), e.bits(0)) << dtype_name(d) << " element " << i;
    }
    for (int64_t i = 0; i < b0.numel(); ++i) {
      HostTensor e(d, 1);
      e.set(0, b0.get(i) * c);
      ASSERT_EQ(m.bias.bits(i), e.bits(0));
    }
    // The clipped gradients have (about) max_norm: rounding into the dtype.
    const double after = grad_norm(m.grads(), o);
    EXPECT_NEAR(after, max_norm, (d == DType::kFloat32 ? 1e-6 : 1e-2) * max_norm);
    // Above the norm: untouched.
    const HostTensor w1 = m.weight_shard;
    const ClipResult r2 = clip_grad_norm(m.grads(), after * 2, o);
    EXPECT_FALSE(r2.clipped);
    EXPECT_EQ(r2.clip_coef, 1.0);
    EXPECT_EQ(m.weight_shard.bytes, w1.bytes);
  }
}

TEST(ClipGradNorm, MaxNormOverShards) {
  ProcessGroupPtr w = world();
  const int victim = w->size() - 1;
  for (DType d : test::kAmpDTypes) {
    Model m(d, 1000, 3, w->size(), w->rank());
    if (w->rank() == victim && m.weight_shard.numel() > 0) m.weight_shard.set(0, -40.0f);
    ClipOptions o;
    o.group = w.get();
    o.norm_type = std::numeric_limits<double>::infinity();
    EXPECT_EQ(grad_norm(m.grads(), o), 40.0) << dtype_name(d);
  }
}

TEST(ClipGradNorm, NonFiniteOnOneRankReachesEveryRank) {
  ProcessGroupPtr w = world();
  const int victim = w->size() / 2;
  for (float planted : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity()}) {
    for (double type : {2.0, std::numeric_limits<double>::infinity()}) {
      Model m(DType::kFloat16, 2000, 3, w->size(), w->rank());
      if (w->rank() == victim) m.bias.set(1, planted);
      const std::vector<unsigned char> before = m.weight_shard.bytes;
      ClipOptions o;
      o.group = w.get();
      o.norm_type = type;
      o.replicated = {false, false};  // the planted bias is this rank's own
      o.names = {"w", "b"};
      const ClipResult r = clip_grad_norm(m.grads(), 1.0, o);
      EXPECT_TRUE(r.non_finite);
      EXPECT_FALSE(r.clipped);
      EXPECT_EQ(std::isnan(r.total_norm), std::isnan(planted)) << r.total_norm;
      EXPECT_EQ(m.weight_shard.bytes, before) << "gradients must stay untouched";
      o.error_if_nonfinite = true;
      try {
        clip_grad_norm(m.grads(), 1.0, o);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (w->rank() == victim) EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
      }
    }
  }
}

TEST(ClipGradNorm, TotalIsBitIdenticalOnEveryRank) {
  ProcessGroupPtr w = world();
  std::mt19937 rng(100 + w->rank());
  HostTensor g(DType::kFloat32, 12345 + 1000 * w->rank());
  test::fill_random(&g, &rng, 1.0f, false);
  ClipOptions o;
  o.group = w.get();
  double norm = grad_norm({g.tensor()}, o);
  std::vector<double> all(w->size());
  w->allgather(Tensor::of(&norm, 1), Tensor::of(all));
  for (double v : all) EXPECT_EQ(std::memcmp(&v, &norm, sizeof(double)), 0);
}

TEST(ClipGradNorm, RejectsBadArguments) {
  std::vector<float> g(4, 1.0f);
  ClipOptions o;
  EXPECT_THROW(clip_grad_norm({Tensor::of(g)}, 0.0, o), Error);
  EXPECT_THROW(clip_grad_norm({Tensor::of(g)}, -1.0, o), Error);
  o.norm_type = 1.0;
  EXPECT_THROW(grad_norm({Tensor::of(g)}, o), Error);
  o.norm_type = 2.0;
  o.replicated = {true, false};
  EXPECT_THROW(grad_norm({Tensor::of(g)}, o), Error);
}

}  // namespace
}  // namespace amp
}  // namespace tutti
