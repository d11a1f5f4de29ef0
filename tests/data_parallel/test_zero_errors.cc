// ShardedOptimizer's construction errors at -np 2 and 3: a setup problem on
// every rank is an Error(kInvalidArgument) saying what was expected; a
// setting that differs across ranks is an Error(kMismatch) on EVERY rank
// naming the first differing rank and setting (no rank is left waiting in a
// collective).
#include <gtest/gtest.h>

#include "data_parallel/test_zero_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;

ReducerOptions plain() {
  ReducerOptions o;
  o.learn_bucket_order = false;
  return o;
}

// The test model's parameters registered with a reducer (built or not).
struct ZeroSetup {
  std::vector<test::TestParam> params = test::make_params(test::zero_decls(DType::kFloat32));
  Reducer reducer;
  explicit ZeroSetup(ReducerOptions o = plain(), bool build = true) : reducer(world(), o) {
    test::register_all(reducer, params);
    if (build) reducer.build();
  }
};

TEST(ZeroErrors, BeforeReducerBuild) {
  ZeroSetup s(plain(), false);
  Reducer& reducer = s.reducer;
  const std::string msg = expect_error(
      [&] { ShardedOptimizer z(reducer, test::test_hyper(optim::Kind::kAdam)); },
      ErrorCode::kInvalidArgument);
  expect_contains(msg, "rank " + std::to_string(world()->rank()));
  expect_contains(msg, "before reducer.build()");
  expect_contains(msg, "call build() first");
}

// The pools: negative sizes are refused (every rank, agreed first); the
// reducer's pool needs a bucket collective and a copying reducer.
TEST(ZeroErrors, PoolSizesRefused) {
  for (int which : {0, 1}) {
    ZeroSetup s;
    Reducer& reducer = s.reducer;
    ShardedOptimizerOptions o;
    (which == 0 ? o.bucket_buffers : o.gather_buffers) = -1;
    const std::string msg = expect_error(
        [&] { ShardedOptimizer z(reducer, test::test_hyper(optim::Kind::kSgd), o); },
        ErrorCode::kInvalidArgument);
    expect_contains(msg, which == 0 ? "bucket_buffers = -1" : "gather_buffers = -1");
  }
  ZeroSetup s;
  const BucketCollective none = [](int, const Tensor&, const OpOptions&) { return WorkPtr(); };
  expect_contains(expect_error([&] { s.reducer.set_bucket_collective(nullptr, 2); },
                               ErrorCode::kInvalidArgument),
                  "needs a bucket collective");
  expect_contains(expect_error([&] { s.reducer.set_bucket_collective(none, -1); },
                               ErrorCode::kInvalidArgument),
                  "must be >= 0");
  ReducerOptions view = plain();
  view.gradient_as_bucket_view = true;
  ZeroSetup v(view);
  expect_contains(expect_error([&] { v.reducer.set_bucket_collective(none, 2); },
                               ErrorCode::kInvalidArgument),
                  "gradient_as_bucket_view = false");
}

// Rank 1 alone uses another learning rate: every rank fails, naming rank 1,
// its value and rank 0's.
TEST(ZeroErrors, HyperParametersDisagree) {
  ZeroSetup s;
  Reducer& reducer = s.reducer;
  optim::Hyper h = test::test_hyper(optim::Kind::kAdamW);
  if (world()->rank() == 1) h.lr = 0.02f;
  const std::string msg = expect_error([&] { ShardedOptimizer z(reducer, h); },
                                       ErrorCode::kMismatch);
  expect_contains(msg, "ShardedOptimizer 'zero'");
  expect_contains(msg, "rank 1");
  expect_contains(msg, "lr=0.0199999996");
  expect_contains(msg, "lr=0.00999999978");
}

// A setup error on one rank only (stage 3 on the last rank) reaches every
// rank instead of leaving the others in the agreement collective.
TEST(ZeroErrors, LocalErrorOnOneRankFailsEveryRank) {
  ZeroSetup s;
  Reducer& reducer = s.reducer;
  ShardedOptimizerOptions o;
  const int last = world()->size() - 1;
  if (world()->rank() == last) o.stage = 3;
  const std::string msg = expect_error(
      [&] { ShardedOptimizer z(reducer, test::test_hyper(optim::Kind::kSgd), o); },
      ErrorCode::kMismatch);
  expect_contains(msg, "rank " + std::to_string(last));
  expect_contains(msg, "stage=3");
}

// Stage 2 needs the reducer's plain all-reduce mode to replace.
TEST(ZeroErrors, Stage2WithHierarchicalReducer) {
  ReducerOptions ro = plain();
  ro.hierarchical = true;
  ro.hierarchical_node_size = 1;
  ZeroSetup s(ro);
  Reducer& reducer = s.reducer;
  const std::string msg = expect_error(
      [&] { ShardedOptimizer z(reducer, test::test_hyper(optim::Kind::kSgd)); },
      ErrorCode::kInvalidArgument);
  expect_contains(msg, "plain mode");
  // Stage 1 keeps the reducer's all-reduce, whatever its mode.
  ShardedOptimizerOptions o;
  o.stage = 1;
  ShardedOptimizer z(reducer, test::test_hyper(optim::Kind::kSgd), o);
  EXPECT_EQ(z.steps(), 0);
}

// step() consumes one reducing synchronize(): a second step() on the same
// (stage 2: stale) gradients is refused; an accumulation pass does not count.
TEST(ZeroErrors, StepWithoutReducingSynchronize) {
  ZeroSetup s;
  ShardedOptimizer z(s.reducer, test::test_hyper(optim::Kind::kSgd));
  auto refused = [&] {
    const std::string msg = expect_error([&] { z.step(); }, ErrorCode::kInvalidArgument);
    expect_contains(msg, "without a reducing synchronize()");
  };
  refused();  // before any backward pass
  auto pass = [&] {
    for (int p = 4; p >= 0; --p) s.reducer.grad_ready(p);
    return s.reducer.synchronize();
  };
  ASSERT_TRUE(pass());
  z.step();
  refused();
  {
    NoSyncGuard g = s.reducer.no_sync();
    EXPECT_FALSE(pass());
  }
  refused();
  ASSERT_TRUE(pass());
  z.step();
  EXPECT_EQ(z.steps(), 2);
}

}  // namespace
}  // namespace tutti
