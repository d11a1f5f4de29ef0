// Launch chains (issue 15: "a bucket that is ready launches without waiting
// for earlier buckets in plan order"), at -np 2 and 4.  With the default
// ReducerOptions::launch_channels (4), host bucket b is on chain b mod 4, each chain
// a communicator of its own; a complete bucket waits only for the earlier
// buckets of its chain (reducer_impl.h).  Checked with real processes:
//   * a complete last bucket is all-reduced (its sum visible in the bucket)
//     while the buckets before it have not even been filled;
//   * ranks reporting gradients in different orders, different every step:
//     how many buckets are launched after each grad_ready() matches a model
//     of the chain rule, and every result matches its closed form.
// test_dp_learned_order runs with one chain (launch_channels = 1, the
// in-order rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::ParamDecl;

// Gradient value of rank r, parameter p, element i, step s: small integers,
// exact sums.
double grad_of(int rank, int p, int64_t i, int step) {
  return static_cast<double>((rank + 1) * (p + 2) + i % 7 + 3 * step);
}

double sum_of(int p, int64_t i, int step) {
  double s = 0;
  for (int r = 0; r < world()->size(); ++r) s += grad_of(r, p, i, step);
  return s;
}

// Each parameter alone in a bucket of 64 bytes (16 float32).
std::vector<ParamDecl> params_of(int n) {
  std::vector<ParamDecl> d;
  for (int p = 0; p < n; ++p) d.push_back({"p" + std::to_string(p), DType::kFloat32, Shape{16}});
  return d;
}

ReducerOptions options(bool learn) {
  ReducerOptions o;
  o.bucket_cap_mb = 64.0 / (1 << 20);
  o.first_bucket_cap_mb = 0;
  o.learn_bucket_order = learn;
  o.op = ReduceOp::kSum;
  return o;
}

int chains_for(int buckets) {
  return static_cast<int>(std::min<int64_t>(ReducerOptions{}.launch_channels, buckets));
}

// bucket_of[p] from the reducer's current plan.
std::vector<int> bucket_of(const Reducer& r, int n) {
  std::vector<int> b(static_cast<size_t>(n), -1);
  for (const auto& l : r.buckets())
    for (const auto& s : l.slots) b[static_cast<size_t>(std::stoi(s.name.substr(1)))] = l.id;
  return b;
}

// The chain rule, modelled: after each of `order`'s gradients is ready, how
// many buckets (one parameter each) have launched.
std::vector<int64_t> model_launches(const std::vector<int>& order, const std::vector<int>& bucket,
                                    int chains) {
  const int n = static_cast<int>(bucket.size());
  std::vector<char> ready(static_cast<size_t>(n), 0);
  std::vector<int> next(static_cast<size_t>(chains));  // next bucket index per chain
  for (int c = 0; c < chains; ++c) next[static_cast<size_t>(c)] = c;
  std::vector<int64_t> out;
  int64_t launched = 0;
  for (int p : order) {
    const int b = bucket[static_cast<size_t>(p)];
    ready[static_cast<size_t>(b)] = 1;
    int& k = next[static_cast<size_t>(b % chains)];
    while (k < n && ready[static_cast<size_t>(k)]) {
      ++launched;
      k += chains;
    }
    out.push_back(launched);
  }
  return out;
}

// The last bucket of the plan completes first on every rank: it is launched
// at once and its all-reduce finishes while buckets 0 and 1 are still empty
// (gradient_as_bucket_view and a sum: the bucket IS the result).  In bucket
// order (one chain) it would wait for synchronize().
TEST(LaunchOrder, CompleteBucketIsReducedBeforeEarlierBucketsFill) {
  ASSERT_GE(chains_for(3), 3) << "expected the default ReducerOptions::launch_channels (4)";
  auto params = test::make_params(params_of(3));
  ReducerOptions o = options(false);
  o.gradient_as_bucket_view = true;
  Reducer r(world(), o);
  for (auto& p : params) r.add_parameter(p.name, p.param_tensor(), Tensor());
  r.build();
  ASSERT_EQ(r.buckets().size(), 3u);
  ASSERT_EQ(bucket_of(r, 3), (std::vector<int>{2, 1, 0})) << "reverse registration order";
  const int rank = world()->rank();
  for (int p = 0; p < 3; ++p) {
    float* g = static_cast<float*>(r.gradient(p).data());
    for (int64_t i = 0; i < 16; ++i) g[i] = static_cast<float>(grad_of(rank, p, i, 0));
  }
  r.grad_ready(0);  // p0: bucket 2, the last
  EXPECT_EQ(r.stats().buckets_reduced, 1);
  EXPECT_EQ(r.stats().buckets_launched_early, 1);
  // Wait (bounded) for the sum to appear in bucket 2.  The collective writes
  // the buffer while we read it; only the final values count.
  const float* g0 = static_cast<const float*>(r.gradient(0).data());
  bool summed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!summed && std::chrono::steady_clock::now() < deadline) {
    summed = true;
    for (int64_t i = 0; i < 16; ++i) summed = summed && g0[i] == static_cast<float>(sum_of(0, i, 0));
    if (!summed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(summed) << "bucket 2 was not reduced within 10 s while buckets 0, 1 were empty";
  r.grad_ready(1);
  r.grad_ready(2);
  EXPECT_EQ(r.stats().buckets_launched_early, 3);
  ASSERT_TRUE(r.synchronize());
  for (int p = 0; p < 3; ++p) {
    const float* g = static_cast<const float*>(r.gradient(p).data());
    for (int64_t i = 0; i < 16; ++i)
      ASSERT_EQ(g[i], static_cast<float>(sum_of(p, i, 0))) << "p" << p << "[" << i << "]";
  }
}

// 7 buckets on 4 chains; every rank reports its gradients in an order of its
// own that changes every step (the learned plan, from rank 0's first step,
// matches nobody's later order).  The launches after each grad_ready()
// follow the chain rule, and the results are exact.
TEST(LaunchOrder, RanksReportInDifferentOrders) {
  constexpr int kN = 7, kSteps = 4;
  auto params = test::make_params(params_of(kN));
  Reducer r(world(), options(true));
  test::register_all(r, params);
  r.build();
  const int rank = world()->rank();
  const int chains = chains_for(kN);
  ASSERT_EQ(chains, 4);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> order(kN);
    for (int k = 0; k < kN; ++k) order[static_cast<size_t>(k)] = (k * (rank + 1) + step * 3) % kN;  // kN prime
    if ((rank + step) % 2) std::reverse(order.begin(), order.end());
    for (int p = 0; p < kN; ++p)
      params[static_cast<size_t>(p)].grad.fill([&](int64_t i) { return grad_of(rank, p, i, step); });
    const std::vector<int64_t> want = model_launches(order, bucket_of(r, kN), chains);
    const int64_t base = r.stats().buckets_reduced;
    for (size_t k = 0; k < order.size(); ++k) {
      r.grad_ready(order[k]);
      ASSERT_EQ(r.stats().buckets_reduced - base, want[k])
          << "step " << step << ", after p" << order[k] << " (" << k + 1 << " ready)";
    }
    ASSERT_TRUE(r.synchronize());
    for (int p = 0; p < kN; ++p)
      EXPECT_TRUE(test::matches(params[static_cast<size_t>(p)].grad,
                                [&](int64_t i) { return sum_of(p, i, step); }))
          << "p" << p << " step " << step;
  }
  EXPECT_EQ(r.stats().bucket_rebuilds, 1) << "rank 0's step-0 order is not the registration order";
}

// The order model itself, on a case worked by hand: 7 buckets, 4 chains
// (0: 0 4, 1: 1 5, 2: 2 6, 3: 3).  Bucket 6 waits for bucket 2 only.
TEST(LaunchOrder, ChainRuleByHand) {
  const std::vector<int> identity = {0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(model_launches({6, 3, 2, 5, 0, 1, 4}, identity, 4),
            (std::vector<int64_t>{0, 1, 3, 3, 4, 6, 7}));
  EXPECT_EQ(model_launches({6, 5, 4, 3, 2, 1, 0}, identity, 1),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 7}));
}

}  // namespace
}  // namespace tutti
