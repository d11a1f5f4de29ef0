// Learned bucket order and early-filled unused parameters (issue 15), at
// -np 2 and 4, flat and hierarchical.  Gradients are dyadic rationals
// (quarters of small integers), so every sum over ranks is exact in any
// order and the learned and the registration-order plans must agree bit for
// bit; each result is also compared with its closed form.  What the learned
// order buys is measured by when buckets launch: how many are in flight
// halfway through the backward pass, and before synchronize().
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::ParamDecl;
using test::TestParam;

// ~3 parameters per 256-byte bucket.
const std::vector<ParamDecl> kParams = {
    {"p0", DType::kFloat32, Shape{16}},    {"p1", DType::kFloat32, Shape{8, 4}},
    {"p2", DType::kFloat32, Shape{20}},    {"p3", DType::kFloat32, Shape{12}},
    {"p4", DType::kFloat32, Shape{24}},    {"p5", DType::kFloat32, Shape{10}},
    {"p6", DType::kFloat32, Shape{3, 6}},  {"p7", DType::kFloat32, Shape{6}},
};
constexpr int kSteps = 4;

double grad_of(int rank, int p, int64_t i, int step) {
  return 0.25 * static_cast<double>((rank + 1) * (p + 1) + i % 5) + step;
}

struct Config {
  bool learn = true;
  bool hierarchical = false;
  bool static_graph = false;
  bool find_unused = false;
};

// used(rank, param, step): whether that rank produces that gradient.
using Used = std::function<bool(int, int, int)>;
// The order a rank reports its gradients in.
using Order = std::function<std::vector<int>(int rank)>;

struct Outcome {
  std::vector<std::vector<unsigned char>> grads;  // [step * P + p] bytes
  std::vector<int64_t> launched_half;    // buckets launched halfway, per step
  std::vector<int64_t> launched_before;  // ... before synchronize(), per step
  std::vector<BucketLayout> buckets;     // the plan after the last step
  ReducerStats stats;
  int64_t num_buckets = 0;
};

ReducerOptions options(const Config& c) {
  ReducerOptions o;
  o.bucket_cap_mb = 256.0 / (1 << 20);
  o.first_bucket_cap_mb = 0;
  o.learn_bucket_order = c.learn;
  o.hierarchical = c.hierarchical;
  o.hierarchical_node_size = 2;
  o.static_graph = c.static_graph;
  o.find_unused_parameters = c.find_unused;
  o.launch_channels = 1;  // in-order launching: the learned order's effect
  return o;
}

Outcome run(const Config& c, const Order& order, const Used& used) {
  const int rank = world()->rank();
  auto params = test::make_params(kParams);
  Reducer r(world(), options(c));
  test::register_all(r, params);
  r.build();
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> ready;
    for (int p : order(rank))
      if (used(rank, p, step)) ready.push_back(p);
    for (int p = 0; p < r.num_parameters(); ++p)
      params[static_cast<size_t>(p)].grad.fill([&](int64_t i) {
        return used(rank, p, step) ? grad_of(rank, p, i, step) : 1e30;  // must not leak
      });
    if (c.find_unused)
      for (int p = 0; p < r.num_parameters(); ++p)
        if (!used(rank, p, step)) r.mark_unused(p);
    const int64_t base = r.stats().buckets_reduced;
    for (size_t k = 0; k < ready.size(); ++k) {
      r.grad_ready(ready[k]);
      if (k + 1 == ready.size() / 2) out.launched_half.push_back(r.stats().buckets_reduced - base);
    }
    out.launched_before.push_back(r.stats().buckets_reduced - base);
    EXPECT_TRUE(r.synchronize());
    for (auto& p : params) out.grads.push_back(p.grad.bytes);
  }
  out.buckets = r.buckets();
  out.stats = r.stats();
  out.num_buckets = static_cast<int64_t>(r.buckets().size());
  return out;
}

// Every gradient of every step equals its closed form: the average over the
// ranks that used it (others contribute zero).
void expect_closed_form(const Outcome& run, const Used& used) {
  const int n = world()->size();
  for (int step = 0; step < kSteps; ++step)
    for (size_t p = 0; p < kParams.size(); ++p) {
      const auto& bytes = run.grads[static_cast<size_t>(step) * kParams.size() + p];
      const float* g = reinterpret_cast<const float*>(bytes.data());
      const int64_t numel = kParams[p].shape.numel();
      for (int64_t i = 0; i < numel; ++i) {
        double sum = 0;
        for (int k = 0; k < n; ++k)
          if (used(k, static_cast<int>(p), step)) sum += grad_of(k, static_cast<int>(p), i, step);
        ASSERT_EQ(g[i], static_cast<float>(sum / n))
            << kParams[p].name << "[" << i << "] step " << step;
      }
    }
}

void expect_same_bits(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t k = 0; k < a.grads.size(); ++k)
    ASSERT_EQ(0, std::memcmp(a.grads[k].data(), b.grads[k].data(), a.grads[k].size()))
        << kParams[k % kParams.size()].name << " step " << k / kParams.size();
}

std::vector<int> registration_order(int) { return {0, 1, 2, 3, 4, 5, 6, 7}; }
bool all_used(int, int, int) { return true; }

class LearnedOrder : public ::testing::TestWithParam<bool> {};  // hierarchical

// Gradients arrive first-registered first: the reverse of what the default
// plan assumes, so without learning bucket 0 (p7 ...) completes last and
// nothing launches before the backward pass ends.
TEST_P(LearnedOrder, ReversedReadyOrder) {
  Config learned, fixed;
  learned.hierarchical = fixed.hierarchical = GetParam();
  fixed.learn = false;
  const Outcome a = run(learned, registration_order, all_used);
  const Outcome b = run(fixed, registration_order, all_used);
  expect_closed_form(a, all_used);
  expect_same_bits(a, b);
  EXPECT_EQ(a.stats.bucket_rebuilds, 1);
  EXPECT_EQ(b.stats.bucket_rebuilds, 0);
  EXPECT_EQ(a.buckets.front().slots.front().name, "p0") << "bucket 0 starts with the first ready";
  EXPECT_EQ(b.buckets.front().slots.front().name, "p7");
  EXPECT_EQ(b.launched_half[1], 0) << "registration plan: bucket 0 waits for p7";
  for (int step = 1; step < kSteps; ++step) {
    EXPECT_GE(a.launched_half[static_cast<size_t>(step)], 1)
        << "learned plan, step " << step << ": buckets launch as they fill";
    EXPECT_EQ(a.launched_before[static_cast<size_t>(step)], a.num_buckets);
  }
}

// p3 is never used: without help its bucket (and every later one) waits for
// synchronize().  Learned: it moves to the last bucket.  static_graph or
// find_unused_parameters: it is filled at the start, nothing waits.
TEST_P(LearnedOrder, UnusedParameter) {
  const Used used = [](int, int p, int) { return p != 3; };
  const Order reverse = [](int) { return std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0}; };
  Config fixed, learned, still, search;
  fixed.learn = false;
  still.static_graph = true;
  search.find_unused = true;
  for (Config* c : {&fixed, &learned, &still, &search}) c->hierarchical = GetParam();
  const Outcome f = run(fixed, reverse, used);
  const Outcome l = run(learned, reverse, used);
  const Outcome s = run(still, reverse, used);
  const Outcome u = run(search, reverse, used);
  expect_closed_form(f, used);
  for (const Outcome* r : {&l, &s, &u}) expect_same_bits(*r, f);
  EXPECT_EQ(l.buckets.back().slots.back().name, "p3") << "never ready: last";
  for (int step = 1; step < kSteps; ++step) {
    const size_t k = static_cast<size_t>(step);
    EXPECT_LT(f.launched_before[k], f.num_buckets - 1) << "p3's bucket blocks the ones after it";
    EXPECT_EQ(l.launched_before[k], l.num_buckets - 1) << "only the last bucket waits";
    EXPECT_EQ(s.launched_before[k], s.num_buckets) << "static_graph: nothing waits";
    EXPECT_EQ(u.launched_before[k], u.num_buckets) << "mark_unused: nothing waits";
  }
  EXPECT_EQ(s.stats.marked_unused, kSteps - 1) << "filled early from step 1 on";
  EXPECT_EQ(s.stats.unready_gradients, 1) << "step 0 found it";
  EXPECT_EQ(u.stats.marked_unused, kSteps);
  EXPECT_EQ(u.stats.unready_gradients, 0);
}

// p5 is unused on rank 1 only: the ranks' plans still agree (rank 0's order
// is everyone's), rank 1 fills p5 early, and p5's average counts the others.
TEST_P(LearnedOrder, UnusedOnOneRankOnly) {
  const Used used = [](int rank, int p, int) { return !(rank == 1 && p == 5); };
  // Ranks also disagree on the order (rank 0: registration, others reverse).
  const Order order = [](int rank) {
    return rank == 0 ? std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}
                     : std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0};
  };
  Config fixed, still, search;
  fixed.learn = false;
  still.static_graph = true;
  search.find_unused = true;
  for (Config* c : {&fixed, &still, &search}) c->hierarchical = GetParam();
  const Outcome f = run(fixed, order, used);
  const Outcome s = run(still, order, used);
  const Outcome u = run(search, order, used);
  expect_closed_form(f, used);
  expect_same_bits(s, f);
  expect_same_bits(u, f);
  EXPECT_EQ(s.buckets.front().slots.front().name, "p0") << "rank 0's order everywhere";
  for (int step = 1; step < kSteps; ++step) {
    EXPECT_EQ(s.launched_before[static_cast<size_t>(step)], s.num_buckets);
    EXPECT_EQ(u.launched_before[static_cast<size_t>(step)], u.num_buckets);
  }
  const bool skipper = world()->rank() == 1;
  EXPECT_EQ(s.stats.marked_unused, skipper ? kSteps - 1 : 0);
  EXPECT_EQ(u.stats.marked_unused, skipper ? kSteps : 0);
}

INSTANTIATE_TEST_SUITE_P(FlatAndHierarchical, LearnedOrder, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "hierarchical" : "flat"; });

// static_graph promises the same used set every step: a parameter unused in
// step 0 that produces a gradient later is refused, naming it.
TEST(LearnedOrderErrors, StaticGraphViolation) {
  auto params = test::make_params(kParams);
  Config c;
  c.static_graph = true;
  Reducer r(world(), options(c));
  test::register_all(r, params);
  r.build();
  for (int p = 7; p >= 0; --p)
    if (p != 3) r.grad_ready(p);
  EXPECT_TRUE(r.synchronize());
  r.grad_ready(7);
  const std::string msg = test::expect_error([&] { r.grad_ready(3); }, ErrorCode::kInvalidArgument);
  test::expect_contains(msg, "'p3'");
  test::expect_contains(msg, "static_graph");
}

TEST(LearnedOrderErrors, MarkUnusedNeedsTheOption) {
  auto params = test::make_params(kParams);
  Reducer r(world(), options(Config{}));
  test::register_all(r, params);
  r.build();
  test::expect_contains(
      test::expect_error([&] { r.mark_unused(1); }, ErrorCode::kInvalidArgument),
      "find_unused_parameters");
  Config both;
  both.static_graph = both.find_unused = true;
  test::expect_error([&] { Reducer bad(world(), options(both)); }, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
