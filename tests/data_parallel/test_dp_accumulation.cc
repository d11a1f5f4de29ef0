// Gradient accumulation: passes inside no_sync() and the first
// backward_passes_per_step - 1 passes of a step issue no collective at all
// (counted with the world communicator's sequence numbers); the reducing
// pass averages the accumulated gradients; a gradient used only in an
// earlier pass of the step contributes its accumulated value.  -np 1..4.
#include <gtest/gtest.h>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;

const std::vector<ParamDecl> kParams = {
    {"a", DType::kFloat64, Shape{5}}, {"b", DType::kFloat64, Shape{2, 3}},
    {"c", DType::kFloat64, Shape{4}}, {"d", DType::kFloat64, Shape{1}}};

// One backward pass: grad[p] += pass value for every parameter in `use`,
// marked ready last-first.
void backward(Reducer& r, std::vector<test::TestParam>& params, int rank, int pass,
              const std::vector<int>& use) {
  for (auto it = use.rbegin(); it != use.rend(); ++it) {
    auto& g = params[static_cast<size_t>(*it)].grad;
    g.fill([&](int64_t i) { return g.get(i) + test::grad_value(rank, *it + 10 * pass, i); });
    r.grad_ready(*it);
  }
}

void zero(std::vector<test::TestParam>& params) {
  for (auto& p : params) p.grad.fill([](int64_t) { return 0.0; });
}

// Expected average after passes 0..passes-1, parameter p used in pass q iff
// used(q, p) (the same on every rank).
double expected(int p, int64_t i, int passes, const std::function<bool(int, int)>& used) {
  const int n = world()->size();
  double sum = 0;
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < passes; ++q)
      if (used(q, p)) sum += test::grad_value(r, p + 10 * q, i);
  return sum / n;
}

// Every parameter holds expected(...) (sums of small integers and one
// division in float64: exact up to the division's rounding).
void expect_averages(std::vector<test::TestParam>& params, int passes,
                     const std::function<bool(int, int)>& used) {
  for (int p = 0; p < static_cast<int>(params.size()); ++p)
    EXPECT_TRUE(test::matches(params[static_cast<size_t>(p)].grad,
                              [&](int64_t i) { return expected(p, i, passes, used); }, 1e-15))
        << "parameter " << p;
}

const auto kAlways = [](int, int) { return true; };

class Accumulation : public ::testing::TestWithParam<int> {};

TEST_P(Accumulation, PassesPerStepCommunicateOnlyOnTheLastPass) {
  const int k = GetParam();
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.bucket_cap_mb = 40.0 / (1 << 20);  // several buckets
  o.backward_passes_per_step = k;
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  const int rank = world()->rank();
  const std::vector<int> all = {0, 1, 2, 3};
  for (int step = 0; step < 2; ++step) {
    zero(params);
    const uint64_t before = test::world_collective_seq();
    for (int pass = 0; pass + 1 < k; ++pass) {
      EXPECT_FALSE(r.next_pass_reduces());
      backward(r, params, rank, pass, all);
      EXPECT_FALSE(r.synchronize());
    }
    EXPECT_EQ(test::world_collective_seq(), before + 1)
        << "accumulation passes issued collectives";
    EXPECT_TRUE(r.next_pass_reduces());
    backward(r, params, rank, k - 1, all);
    EXPECT_TRUE(r.synchronize());
    expect_averages(params, k, kAlways);
  }
  EXPECT_EQ(r.stats().accumulation_passes, 2 * (k - 1));
  EXPECT_EQ(r.stats().steps, 2);
}

TEST_P(Accumulation, NoSyncScopesDoNotCommunicate) {
  const int k = GetParam();
  auto params = test::make_params(kParams);
  Reducer r(world());
  test::register_all(r, params);
  r.build();
  const int rank = world()->rank();
  const std::vector<int> all = {0, 1, 2, 3};
  zero(params);
  const uint64_t before = test::world_collective_seq();
  {
    auto guard = r.no_sync();
    for (int pass = 0; pass + 1 < k; ++pass) {
      EXPECT_FALSE(r.next_pass_reduces());
      backward(r, params, rank, pass, all);
      if (pass % 2 == 0) EXPECT_FALSE(r.synchronize());  // optional inside no_sync
    }
  }
  EXPECT_EQ(test::world_collective_seq(), before + 1);
  EXPECT_TRUE(r.next_pass_reduces());
  backward(r, params, rank, k - 1, all);
  EXPECT_TRUE(r.synchronize());
  expect_averages(params, k, kAlways);
}

INSTANTIATE_TEST_SUITE_P(Passes, Accumulation, ::testing::Values(1, 2, 3));

TEST(AccumulationUnused, UsedEarlierInTheStepCountsUsedNeverIsZero) {
  // 3 passes per step.  "a" is used only in pass 0, "b" in passes 0 and 2,
  // "c" never, "d" always: the reducing pass misses "a" and "c"; "a" must
  // contribute its accumulated pass-0 value, "c" zero.
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.backward_passes_per_step = 3;
  o.bucket_cap_mb = 1e-9;  // one bucket per tensor
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  auto used = [](int q, int p) {
    return (p == 0 && q == 0) || (p == 1 && q != 1) || p == 3;
  };
  const int rank = world()->rank();
  zero(params);
  params[2].grad.fill([](int64_t) { return 7.0; });  // stale; never marked ready
  for (int q = 0; q < 3; ++q) {
    std::vector<int> use;
    for (int p = 0; p < 4; ++p)
      if (used(q, p)) use.push_back(p);
    backward(r, params, rank, q, use);
    EXPECT_EQ(r.synchronize(), q == 2);
  }
  expect_averages(params, 3, used);
  EXPECT_EQ(r.stats().unready_gradients, 2);
}

TEST(AccumulationMisuse, HorovodStyleSingleSynchronizeIsCaught) {
  // With backward_passes_per_step = 2 synchronize() ends every pass; calling
  // it only once per step marks a gradient ready twice in one "pass".
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.backward_passes_per_step = 2;
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  r.grad_ready(0);
  expect_contains(expect_error([&] { r.grad_ready(0); }, ErrorCode::kInvalidArgument),
                  "backward_passes_per_step = 2 counts those calls");
}

}  // namespace
}  // namespace tutti
