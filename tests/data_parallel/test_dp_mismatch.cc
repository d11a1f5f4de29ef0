// Ranks that registered different parameters (or options) fail in build()
// on EVERY rank with the first differing name, shape or dtype; nobody
// hangs, and the world stays usable.  -np 2..4.
#include <gtest/gtest.h>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;

const std::vector<ParamDecl> kModel = {
    {"fc1.weight", DType::kFloat32, Shape{16, 8}},
    {"fc1.bias", DType::kFloat32, Shape{16}},
    {"fc2.weight", DType::kFloat32, Shape{4, 16}},
    {"fc2.bias", DType::kFloat32, Shape{4}},
};

class Mismatch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (w->size() < 2) GTEST_SKIP() << "needs two or more ranks";
  }
  // Builds a reducer over `decls` (with `o`) and returns build()'s error.
  std::string build_error(const std::vector<ParamDecl>& decls, const ReducerOptions& o = {}) {
    auto params = test::make_params(decls);
    Reducer r(w, o);
    test::register_all(r, params);
    const std::string m = expect_error([&] { r.build(); }, ErrorCode::kMismatch);
    expect_contains(m, "rank " + std::to_string(w->rank()) + ": Reducer 'dp' build: ranks disagree");
    return m;
  }
  void expect_world_usable() {
    int32_t one = 1;
    w->allreduce(Tensor::of(&one, 1));
    EXPECT_EQ(one, w->size());
  }
  ProcessGroupPtr w = world();
  int last = w->size() - 1;
};

TEST_F(Mismatch, DifferentShapeNamesNameAndBothShapes) {
  auto decls = kModel;
  if (w->rank() == last) decls[2].shape = Shape{5, 16};
  const std::string m = build_error(decls);
  expect_contains(m, "rank " + std::to_string(last) +
                         "'s parameter #2 is 'fc2.weight' float32[5, 16] cpu, but rank 0's is "
                         "'fc2.weight' float32[4, 16] cpu");
  expect_world_usable();
}

TEST_F(Mismatch, DifferentDType) {
  auto decls = kModel;
  if (w->rank() == 1) decls[1].dtype = DType::kFloat16;
  const std::string m = build_error(decls);
  expect_contains(m, "rank 1's parameter #1 is 'fc1.bias' float16[16] cpu, but rank 0's is "
                     "'fc1.bias' float32[16] cpu");
  expect_world_usable();
}

TEST_F(Mismatch, DifferentNameAndOrder) {
  auto decls = kModel;
  if (w->rank() == last) std::swap(decls[0], decls[1]);
  const std::string m = build_error(decls);
  expect_contains(m, "parameter #0 is 'fc1.bias' float32[16] cpu, but rank 0's is "
                     "'fc1.weight' float32[16, 8] cpu");
  expect_world_usable();
}

TEST_F(Mismatch, MissingAndExtraParameter) {
  auto decls = kModel;
  if (w->rank() == last) decls.pop_back();
  std::string m = build_error(decls);
  expect_contains(m, "rank " + std::to_string(last) + " has 3 parameters and rank 0 has 4: rank "
                     "0's parameter #3 'fc2.bias' float32[4] cpu is missing on rank " +
                         std::to_string(last));
  decls = kModel;
  if (w->rank() == 1) decls.push_back({"extra.scale", DType::kFloat32, Shape{1}});
  m = build_error(decls);
  expect_contains(m, "rank 1's parameter #4 'extra.scale' float32[1] cpu is not on rank 0");
  expect_world_usable();
}

TEST_F(Mismatch, SeveralRanksDiffer) {
  if (w->size() < 3) GTEST_SKIP() << "needs three or more ranks";
  auto decls = kModel;
  if (w->rank() > 0) decls[3].shape = Shape{static_cast<int64_t>(4 + w->rank())};
  const std::string m = build_error(decls);
  expect_contains(m, "rank 1's parameter #3 is 'fc2.bias' float32[5] cpu");
  expect_contains(m, "(" + std::to_string(w->size() - 1) + " ranks differ from rank 0)");
  expect_world_usable();
}

TEST_F(Mismatch, DifferentOptions) {
  ReducerOptions o;
  if (w->rank() == 1) o.bucket_cap_mb = 5;
  std::string m = build_error(kModel, o);
  expect_contains(m, "rank 1's option #0 is bucket_cap_mb=5, but rank 0's is bucket_cap_mb=25");
  ReducerOptions k;
  if (w->rank() == last) k.backward_passes_per_step = 2;
  m = build_error(kModel, k);
  expect_contains(m, "option #2 is backward_passes_per_step=2, but rank 0's is "
                     "backward_passes_per_step=1");
  expect_world_usable();
}

TEST_F(Mismatch, AgreeingRanksBuildAfterFailures) {
  auto params = test::make_params(kModel);
  Reducer r(w);
  test::register_all(r, params);
  r.build();
  EXPECT_EQ(r.buckets().size(), 1u) << "852 bytes fit the default 1 MiB first bucket";
  for (int i = 0; i < r.num_parameters(); ++i) r.grad_ready(i);
  EXPECT_TRUE(r.synchronize());
}

TEST_F(Mismatch, BroadcastStateListsMustAgree) {
  auto params = test::make_params(kModel);
  Reducer r(w);
  test::register_all(r, params);
  r.build();
  std::vector<float> m1(16), v1(w->rank() == 1 ? 17 : 16);
  int64_t step = 3;
  StateDict sd = {{"adam.fc1.bias.m", Tensor::of(m1), {}},
                  {"adam.fc1.bias.v", Tensor::of(v1), {}},
                  {"adam.step", Tensor::of(&step, 1), {}}};
  const std::string m = expect_error([&] { r.broadcast_state(sd, 0); }, ErrorCode::kMismatch);
  expect_contains(m, "Reducer 'dp' broadcast_state: ranks disagree: rank 1's state entry #1 is "
                     "'adam.fc1.bias.v' float32[17] cpu, but rank 0's is 'adam.fc1.bias.v' "
                     "float32[16] cpu");
  expect_world_usable();
}

}  // namespace
}  // namespace tutti
