// The reducer on gradients with closed-form averages: dtypes, bucket caps,
// zero-sized tensors, readiness orders that differ across ranks, unused
// parameters, bit-identity across ranks, misuse errors.  Run at -np 1..4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::grad_value;
using test::ParamDecl;
using test::TestParam;

const std::vector<ParamDecl> kMixed = {
    {"embed.weight", DType::kFloat32, Shape{7}},
    {"block.norm", DType::kFloat16, Shape{3, 5}},
    {"block.scale", DType::kFloat64, Shape{1}},
    {"block.empty", DType::kFloat32, Shape{0}},
    {"block.proj", DType::kBFloat16, Shape{33}},
    {"counter", DType::kInt32, Shape{4}},
    {"head.weight", DType::kFloat32, Shape{40, 25}},
    {"head.bias", DType::kFloat32, Shape{25}},
};

// Caps in MiB: one bucket per tensor, ~512 B buckets, everything in one.
const double kCaps[] = {1e-9, 512.0 / (1 << 20), 1000.0};

ReducerOptions options(double cap, ReduceOp op = ReduceOp::kAvg) {
  ReducerOptions o;
  o.bucket_cap_mb = cap;
  o.first_bucket_cap_mb = cap / 4;
  o.op = op;
  return o;
}

void fill_grads(std::vector<TestParam>& params, int rank, int step = 0) {
  for (size_t p = 0; p < params.size(); ++p)
    params[p].grad.fill([&](int64_t i) { return grad_value(rank, static_cast<int>(p) + step, i); });
}

// Expected value of element i of parameter p when `users(r)` says whether
// rank r contributed (unused ranks contribute zero).
::testing::AssertionResult check_grads(std::vector<TestParam>& params, ReduceOp op,
                                       int step,
                                       const std::function<bool(int, int)>& used) {
  const int n = world()->size();
  for (size_t p = 0; p < params.size(); ++p) {
    auto r = test::matches(params[p].grad, [&](int64_t i) {
      double sum = 0;
      for (int k = 0; k < n; ++k)
        if (used(k, static_cast<int>(p)))
          sum += test::stored(params[p].grad.dtype, grad_value(k, static_cast<int>(p) + step, i));
      return op == ReduceOp::kSum ? test::stored(params[p].grad.dtype, sum)
                                  : test::expected_avg(params[p].grad.dtype, sum, n);
    });
    if (!r) return r << " in " << params[p].name;
  }
  return ::testing::AssertionSuccess();
}

const auto kAllUsed = [](int, int) { return true; };

class Reduce : public ::testing::TestWithParam<std::tuple<double, ReduceOp>> {};

TEST_P(Reduce, ClosedFormOverSteps) {
  const double cap = std::get<0>(GetParam());
  const ReduceOp op = std::get<1>(GetParam());
  auto params = test::make_params(kMixed);
  Reducer reducer(world(), options(cap, op));
  test::register_all(reducer, params);
  reducer.build();
  const int rank = world()->rank();
  for (int step = 0; step < 3; ++step) {
    fill_grads(params, rank, step);
    for (int i = reducer.num_parameters() - 1; i >= 0; --i) reducer.grad_ready(i);
    EXPECT_TRUE(reducer.synchronize());
    EXPECT_TRUE(check_grads(params, op, step, kAllUsed)) << "step " << step;
  }
  const ReducerStats s = reducer.stats();
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.buckets_reduced, 3 * static_cast<int64_t>(reducer.buckets().size()));
  EXPECT_EQ(s.buckets_launched_early, s.buckets_reduced)
      << "every bucket completes during the backward pass";
  EXPECT_EQ(s.unready_gradients, 0);
}

INSTANTIATE_TEST_SUITE_P(CapsAndOps, Reduce,
                         ::testing::Combine(::testing::ValuesIn(kCaps),
                                            ::testing::Values(ReduceOp::kAvg, ReduceOp::kSum)));

TEST(ReduceOrder, ReadyOrderDiffersAcrossRanks) {
  // Each rank marks gradients ready in its own random order; buckets still
  // launch in plan order everywhere, so the collectives match.
  for (double cap : kCaps) {
    auto params = test::make_params(kMixed);
    Reducer reducer(world(), options(cap));
    test::register_all(reducer, params);
    reducer.build();
    const int rank = world()->rank();
    std::mt19937 rng(1234 + 77 * rank);
    for (int step = 0; step < 3; ++step) {
      fill_grads(params, rank, step);
      std::vector<int> order(params.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int i : order) reducer.grad_ready(i);
      EXPECT_TRUE(reducer.synchronize());
      EXPECT_TRUE(check_grads(params, ReduceOp::kAvg, step, kAllUsed)) << "cap " << cap;
    }
  }
}

TEST(ReduceUnused, UnreadyGradientsCountAsZeroEverywhere) {
  // Parameter 0 is unused on every rank; parameter p > 0 is unused on the
  // ranks where (p + rank) % 3 == 0, so each rank skips a different set and
  // some buckets are complete on one rank but not on another.  Unused
  // gradients hold poison that must not leak into the result.
  const int rank = world()->rank();
  auto used = [](int r, int p) { return p != 0 && (p + r) % 3 != 0; };
  for (double cap : kCaps) {
    auto params = test::make_params(kMixed);
    Reducer reducer(world(), options(cap));
    test::register_all(reducer, params);
    reducer.build();
    for (int step = 0; step < 2; ++step) {
      fill_grads(params, rank, step);
      int skipped = 0;
      for (int i = reducer.num_parameters() - 1; i >= 0; --i) {
        if (used(rank, i)) {
          reducer.grad_ready(i);
        } else {
          params[static_cast<size_t>(i)].grad.fill([](int64_t) { return 99.0; });
          ++skipped;
        }
      }
      EXPECT_TRUE(reducer.synchronize());
      EXPECT_TRUE(check_grads(params, ReduceOp::kAvg, step, used)) << "cap " << cap;
      EXPECT_EQ(reducer.stats().unready_gradients, (step + 1) * skipped);
    }
  }
}

TEST(ReduceUnused, NoGradientReadyAtAll) {
  auto params = test::make_params(kMixed);
  Reducer reducer(world(), options(kCaps[1]));
  test::register_all(reducer, params);
  reducer.build();
  for (auto& p : params) p.grad.fill([](int64_t) { return 5.0; });
  EXPECT_TRUE(reducer.synchronize());
  for (auto& p : params) EXPECT_TRUE(test::matches(p.grad, [](int64_t) { return 0.0; }));
  EXPECT_EQ(reducer.stats().buckets_launched_early, 0);
}

TEST(ReduceIdentity, AveragedGradientsAreBitIdenticalAcrossRanks) {
  // Random non-representable values: every rounding matters.  After
  // synchronize() all ranks must hold the same bits (what lets the AMP
  // non-finite check skip a collective).
  const std::vector<ParamDecl> decls = {
      {"a", DType::kFloat32, Shape{1000}}, {"b", DType::kFloat16, Shape{257}},
      {"c", DType::kBFloat16, Shape{129}}, {"d", DType::kFloat64, Shape{77}},
      {"e", DType::kFloat32, Shape{3, 3}}};
  auto params = test::make_params(decls);
  Reducer reducer(world(), options(1024.0 / (1 << 20)));
  test::register_all(reducer, params);
  reducer.build();
  std::mt19937 rng(99 + world()->rank());
  std::normal_distribution<double> normal(0.0, 1.0);
  for (auto& p : params) p.grad.fill([&](int64_t) { return normal(rng) * 1e3; });
  for (int i = reducer.num_parameters() - 1; i >= 0; --i) reducer.grad_ready(i);
  reducer.synchronize();
  std::vector<unsigned char> all;
  for (auto& p : params) all.insert(all.end(), p.grad.bytes.begin(), p.grad.bytes.end());
  EXPECT_TRUE(test::same_on_every_rank(all));
}

TEST(ReduceMisuse, ReadyTwiceInOnePass) {
  auto params = test::make_params(kMixed);
  Reducer reducer(world(), options(kCaps[2]));
  test::register_all(reducer, params);
  reducer.build();
  reducer.grad_ready(3);
  expect_contains(expect_error([&] { reducer.grad_ready(3); }, ErrorCode::kInvalidArgument),
                  "grad_ready('block.empty') called twice in one backward pass");
  expect_contains(expect_error([&] { reducer.no_sync(); }, ErrorCode::kInvalidArgument),
                  "no_sync() opened after 1 gradient(s)");
  EXPECT_TRUE(reducer.synchronize()) << "the reducer is still usable";
  fill_grads(params, world()->rank());
  for (int i = 0; i < reducer.num_parameters(); ++i) reducer.grad_ready(i);
  EXPECT_TRUE(reducer.synchronize());
  EXPECT_TRUE(check_grads(params, ReduceOp::kAvg, 0, kAllUsed));
}

// Buffers are allocated by build() and, when the learned order re-plans the
// buckets (registration order here: it does), once more at the end of the
// first step; never afterwards.
TEST(ReduceAlloc, BuffersAreAllocatedOnlyAtBuildAndRebuild) {
  auto params = test::make_params(kMixed);
  Reducer reducer(world(), options(kCaps[1]));
  test::register_all(reducer, params);
  reducer.build();
  const int64_t after_build = reducer.stats().buffer_allocations;
  EXPECT_EQ(after_build, static_cast<int64_t>(reducer.buckets().size()));
  int64_t after_first = 0;
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < reducer.num_parameters(); ++i) reducer.grad_ready(i);
    reducer.synchronize();
    if (step == 0) after_first = reducer.stats().buffer_allocations;
  }
  EXPECT_EQ(reducer.stats().bucket_rebuilds, 1);
  EXPECT_EQ(reducer.stats().buffer_allocations, after_first);
  // The pool hands the old buckets' memory to the new ones where it fits.
  EXPECT_LT(after_first, 2 * after_build);
}

}  // namespace
}  // namespace tutti

namespace tutti {
namespace {

TEST(ReduceGroups, SubgroupAveragesWithinItsRanks) {
  // A data-parallel group that is not the world (as in a TP x DP mesh):
  // even and odd world ranks form two groups, each averaging only its own.
  auto w = world();
  auto dp = w->split_group(w->rank() % 2, w->rank(), "dp");
  auto params = test::make_params(kMixed);
  Reducer reducer(dp, options(kCaps[1]));
  test::register_all(reducer, params);
  reducer.build();
  fill_grads(params, w->rank());
  for (int i = reducer.num_parameters() - 1; i >= 0; --i) reducer.grad_ready(i);
  EXPECT_TRUE(reducer.synchronize());
  for (size_t p = 0; p < params.size(); ++p)
    EXPECT_TRUE(test::matches(params[p].grad, [&](int64_t i) {
      double sum = 0;
      for (int k = w->rank() % 2; k < w->size(); k += 2)
        sum += test::stored(params[p].grad.dtype, grad_value(k, static_cast<int>(p), i));
      return test::expected_avg(params[p].grad.dtype, sum, dp->size());
    })) << params[p].name;
}

TEST(ReduceGroups, EmptyModel) {
  Reducer reducer(world());
  reducer.build();
  EXPECT_TRUE(reducer.buckets().empty());
  EXPECT_TRUE(reducer.synchronize());
  reducer.broadcast_parameters(0);
}

}  // namespace
}  // namespace tutti
