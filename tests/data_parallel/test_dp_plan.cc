// The bucket plan (a pure function) and the reducer's argument checks.
#include <gtest/gtest.h>

#include "data_parallel/bucket_plan.h"
#include "data_parallel/dp_test_util.h"
#include "data_parallel/list_agreement.h"

namespace tutti {
namespace {

using dp::ParamSpec;
using dp::plan_buckets;
using test::expect_contains;
using test::expect_error;

std::vector<ParamSpec> specs(const std::vector<std::pair<DType, int64_t>>& v) {
  std::vector<ParamSpec> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back({"p" + std::to_string(i), v[i].first, Device::cpu(), Shape{v[i].second}});
  return out;
}

// Parameter indices of each bucket, in slot order.
std::vector<std::vector<int>> members(const std::vector<dp::PlannedBucket>& plan) {
  std::vector<std::vector<int>> out;
  for (const auto& b : plan) out.push_back(b.params);
  return out;
}

const DType f32 = DType::kFloat32;

TEST(BucketPlan, ReverseOrderAndCap) {
  // 5 tensors of 10 floats (40 bytes); cap 100 bytes -> 2 per bucket.
  auto plan = plan_buckets(specs({{f32, 10}, {f32, 10}, {f32, 10}, {f32, 10}, {f32, 10}}), 100, 0);
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{4, 3}, {2, 1}, {0}}));
  for (size_t b = 0; b < plan.size(); ++b) {
    EXPECT_EQ(plan[b].layout.id, static_cast<int>(b));
    int64_t off = 0;
    for (const auto& s : plan[b].layout.slots) {
      EXPECT_EQ(s.offset, off) << "slots are packed back to back";
      off += s.shape.numel();
    }
    EXPECT_EQ(plan[b].layout.numel, off);
    EXPECT_EQ(plan[b].bytes, static_cast<size_t>(off) * 4);
    EXPECT_LE(plan[b].bytes, 100u);
  }
  EXPECT_EQ(plan[0].layout.slots[0].name, "p4");
}

TEST(BucketPlan, ExactFitClosesTheBucket) {
  auto plan = plan_buckets(specs({{f32, 10}, {f32, 10}, {f32, 10}}), 80, 0);
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{2, 1}, {0}}));
}

TEST(BucketPlan, FirstBucketHasItsOwnCap) {
  auto plan = plan_buckets(specs({{f32, 10}, {f32, 10}, {f32, 10}, {f32, 10}, {f32, 10}}), 1000, 40);
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{4}, {3, 2, 1, 0}}));
}

TEST(BucketPlan, OneBucketPerTensorAndOneForAll) {
  auto s = specs({{f32, 3}, {f32, 1}, {f32, 7}, {f32, 2}});
  EXPECT_EQ(members(plan_buckets(s, 1, 1)),
            (std::vector<std::vector<int>>{{3}, {2}, {1}, {0}}));
  EXPECT_EQ(members(plan_buckets(s, 1 << 30, 0)),
            (std::vector<std::vector<int>>{{3, 2, 1, 0}}));
}

TEST(BucketPlan, LargeTensorGetsItsOwnBucket) {
  auto plan = plan_buckets(specs({{f32, 2}, {f32, 1000}, {f32, 2}}), 64, 0);
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{2}, {1}, {0}}));
  EXPECT_EQ(plan[1].bytes, 4000u);
}

TEST(BucketPlan, OneDTypePerBucket) {
  const DType f16 = DType::kFloat16;
  auto plan = plan_buckets(specs({{f32, 4}, {f16, 4}, {f32, 4}, {f16, 4}}), 1 << 20, 0);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].layout.dtype, f16) << "created first: p3 is the last registered";
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{3, 1}, {2, 0}}));
  // Each dtype has its own first-bucket cap.
  plan = plan_buckets(specs({{f32, 4}, {f16, 4}, {f32, 4}, {f16, 4}}), 1 << 20, 8);
  EXPECT_EQ(members(plan), (std::vector<std::vector<int>>{{3}, {2}, {1}, {0}}));
}

TEST(BucketPlan, ZeroSizedTensorsHaveSlots) {
  auto plan = plan_buckets(specs({{f32, 0}, {f32, 5}, {f32, 0}}), 1 << 20, 0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].layout.slots.size(), 3u);
  EXPECT_EQ(plan[0].layout.numel, 5);
}

TEST(BucketPlan, MibToBytes) {
  EXPECT_EQ(dp::mib_to_bytes(25), 25u * 1024 * 1024);
  EXPECT_EQ(dp::mib_to_bytes(1e-12), 1u);
  EXPECT_EQ(dp::mib_to_bytes(0), 0u);
}

TEST(ListAgreement, HashDependsOnItemBoundaries) {
  EXPECT_NE(dp::hash_items({"ab", "c"}), dp::hash_items({"a", "bc"}));
  EXPECT_EQ(dp::hash_items({"ab", "c"}), dp::hash_items({"ab", "c"}));
}

TEST(ReducerOptions, Validated) {
  auto w = world();
  auto bad = [&](const std::function<void(ReducerOptions&)>& edit, const std::string& what) {
    ReducerOptions o;
    edit(o);
    expect_contains(expect_error([&] { Reducer r(w, o); }, ErrorCode::kInvalidArgument), what);
  };
  bad([](ReducerOptions& o) { o.bucket_cap_mb = 0; }, "bucket_cap_mb = 0");
  bad([](ReducerOptions& o) { o.first_bucket_cap_mb = -1; }, "first_bucket_cap_mb");
  bad([](ReducerOptions& o) { o.backward_passes_per_step = 0; }, "backward_passes_per_step = 0");
  bad([](ReducerOptions& o) { o.op = ReduceOp::kMax; }, "op max");
  bad([](ReducerOptions& o) { o.hierarchical_node_size = -2; }, "hierarchical_node_size");
  expect_error([&] { Reducer r(nullptr); }, ErrorCode::kInvalidArgument);
}

TEST(ReducerOptions, FromEnvReadsTheSettings) {
  setenv("TUTTI_BUCKET_MB", "3.5", 1);
  setenv("TUTTI_FIRST_BUCKET_MB", "0", 1);
  setenv("TUTTI_HIERARCHICAL", "1", 1);
  config::reload();
  ReducerOptions o = ReducerOptions::from_env();
  EXPECT_EQ(o.bucket_cap_mb, 3.5);
  EXPECT_EQ(o.first_bucket_cap_mb, 0);
  EXPECT_TRUE(o.hierarchical);
  unsetenv("TUTTI_BUCKET_MB");
  unsetenv("TUTTI_FIRST_BUCKET_MB");
  unsetenv("TUTTI_HIERARCHICAL");
  config::reload();
  o = ReducerOptions::from_env();
  EXPECT_EQ(o.bucket_cap_mb, 25);
  EXPECT_EQ(o.first_bucket_cap_mb, 1);
  EXPECT_FALSE(o.hierarchical);
}

TEST(Reducer, RegistrationErrors) {
  std::vector<float> a(6), ga(6), gb(5);
  Reducer r(world());
  const Tensor pa(a.data(), DType::kFloat32, Shape{2, 3});
  EXPECT_EQ(r.add_parameter("a", pa, Tensor(ga.data(), DType::kFloat32, Shape{2, 3})), 0);
  expect_contains(expect_error([&] { r.add_parameter("a", pa, pa); }, ErrorCode::kInvalidArgument),
                  "already registered");
  expect_contains(expect_error([&] { r.add_parameter("b", pa, Tensor::of(gb)); },
                               ErrorCode::kInvalidArgument),
                  "has 5 elements, the parameter float32[2, 3] cpu has 6");
  expect_contains(expect_error([&] { r.add_parameter("", pa, pa); }, ErrorCode::kInvalidArgument),
                  "empty");
  expect_contains(expect_error([&] { r.grad_ready(0); }, ErrorCode::kInvalidArgument),
                  "before build()");
  expect_contains(expect_error([&] { r.synchronize(); }, ErrorCode::kInvalidArgument),
                  "before build()");
  r.build();
  EXPECT_EQ(r.num_parameters(), 1);
  expect_contains(expect_error([&] { r.add_parameter("c", pa, pa); }, ErrorCode::kInvalidArgument),
                  "already built");
  expect_contains(expect_error([&] { r.build(); }, ErrorCode::kInvalidArgument), "twice");
  expect_contains(expect_error([&] { r.grad_ready(1); }, ErrorCode::kInvalidArgument),
                  "grad_ready(1): no such parameter (1 registered)");
}

TEST(Reducer, CudaTensorWithoutDeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is present";
  std::vector<float> a(4), g(4);
  Reducer r(world());
  r.add_parameter("a", Tensor(a.data(), DType::kFloat32, Shape{4}, Device::cuda(0)),
                  Tensor(g.data(), DType::kFloat32, Shape{4}, Device::cuda(0)));
  expect_error([&] { r.build(); }, cuda_built() ? ErrorCode::kCuda : ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace tutti
