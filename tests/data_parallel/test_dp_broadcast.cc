// broadcast_parameters / broadcast_state copy the root's values to every
// rank: many small tensors (packed into chunks), tensors larger than a chunk
// (in place), mixed dtypes, roots 0 and size-1.  -np 1..4.
#include <gtest/gtest.h>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;

// 40 small float32 tensors, a float64 pair, a bfloat16 run, an int64 and
// one float32 tensor larger than the chunk.
std::vector<ParamDecl> model() {
  std::vector<ParamDecl> d;
  for (int i = 0; i < 40; ++i)
    d.push_back({"small" + std::to_string(i), DType::kFloat32, Shape{1 + i % 7}});
  d.push_back({"d0", DType::kFloat64, Shape{5}});
  d.push_back({"d1", DType::kFloat64, Shape{2, 2}});
  d.push_back({"h0", DType::kBFloat16, Shape{9}});
  d.push_back({"h1", DType::kBFloat16, Shape{0}});
  d.push_back({"steps", DType::kInt64, Shape{1}});
  d.push_back({"big", DType::kFloat32, Shape{3000}});
  return d;
}

double value(int rank, size_t p, int64_t i) {
  return static_cast<double>((rank * 1000 + static_cast<int>(p) * 10 + i) % 200);
}

class Broadcast : public ::testing::TestWithParam<bool> {
 protected:
  int root() const { return GetParam() ? world()->size() - 1 : 0; }
};

TEST_P(Broadcast, ParametersFromRoot) {
  auto params = test::make_params(model());
  ReducerOptions o;
  o.bucket_cap_mb = 1024.0 / (1 << 20);  // 1 KiB chunks: "big" goes alone
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  const int rank = world()->rank();
  for (size_t p = 0; p < params.size(); ++p) {
    params[p].param.fill([&](int64_t i) { return value(rank, p, i); });
    params[p].grad.fill([&](int64_t) { return -1.0; });
  }
  const uint64_t before = test::world_collective_seq();
  for (int round = 0; round < 2; ++round) r.broadcast_parameters(root());
  const uint64_t used = test::world_collective_seq() - before - 1;
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_TRUE(test::matches(params[p].param, [&](int64_t i) {
      return test::stored(params[p].param.dtype, value(root(), p, i));
    })) << params[p].name;
    EXPECT_TRUE(test::matches(params[p].grad, [](int64_t) { return -1.0; }))
        << "gradients untouched";
  }
  if (world()->size() > 1) {
    // 46 tensors in a handful of packed chunks per round, not 46 broadcasts.
    EXPECT_LE(used, 2u * 10u);
    EXPECT_GE(used, 2u * 5u) << "f32 runs, f64, bf16, int64 and big at least";
  }
}

struct Counter : Stateful {
  std::vector<double> moments = std::vector<double>(12);
  int64_t step = 0;
  int loaded = 0;
  StateDict state_dict() override {
    return {{"opt.moments", Tensor::of(moments), {}}, {"opt.step", Tensor::of(&step, 1), {}}};
  }
  void on_state_loaded() override { ++loaded; }
};

TEST_P(Broadcast, StateFromRoot) {
  Reducer r(world());  // broadcast_state needs no build()
  const int rank = world()->rank();
  std::vector<float> m(100, static_cast<float>(rank)), v(3, -static_cast<float>(rank));
  std::vector<uint16_t> h(6, float_to_half(static_cast<float>(rank + 1)));
  StateDict sd = {{"m", Tensor::of(m), {}},
                  {"v", Tensor::of(v), {}},
                  {"h", Tensor(h.data(), DType::kFloat16, Shape{2, 3}), {}}};
  r.broadcast_state(sd, root());
  for (float x : m) EXPECT_EQ(x, static_cast<float>(root()));
  for (float x : v) EXPECT_EQ(x, -static_cast<float>(root()));
  for (uint16_t x : h) EXPECT_EQ(half_to_float(x), static_cast<float>(root() + 1));

  Counter c;
  for (size_t i = 0; i < c.moments.size(); ++i) c.moments[i] = rank + 0.25 * static_cast<double>(i);
  c.step = 10 + rank;
  r.broadcast_state(c, root());
  EXPECT_EQ(c.step, 10 + root());
  EXPECT_EQ(c.moments[5], root() + 1.25);
  EXPECT_EQ(c.loaded, rank == root() ? 0 : 1) << "on_state_loaded on every rank but the root";
}

// Per-rank state (ShardInfo::per_rank: error-feedback residuals) belongs to
// its rank: broadcasting it would give every rank the root's residual, so its
// error is fed back W times.  It stays as each rank had it; the rest is the
// root's.
TEST_P(Broadcast, PerRankStateStaysWithItsRank) {
  Reducer r(world());
  const int rank = world()->rank();
  std::vector<float> shared(4, static_cast<float>(rank)), own(5, 100.0f + rank);
  ShardInfo mine;
  mine.per_rank = true;
  mine.group = "dp";
  StateDict sd = {{"c/bucket0/step", Tensor::of(shared), {}},
                  {"c/bucket0/residual", Tensor::of(own), mine}};
  r.broadcast_state(sd, root());
  for (float x : shared) EXPECT_EQ(x, static_cast<float>(root()));
  for (float x : own) EXPECT_EQ(x, 100.0f + rank) << "rank " << rank << "'s own residual";
}

INSTANTIATE_TEST_SUITE_P(Roots, Broadcast, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "LastRank" : "RankZero";
                         });

TEST(BroadcastErrors, BadRootAndNotBuilt) {
  std::vector<float> p(3), g(3);
  Reducer r(world());
  r.add_parameter("p", Tensor::of(p), Tensor::of(g));
  expect_contains(expect_error([&] { r.broadcast_parameters(0); }, ErrorCode::kInvalidArgument),
                  "before build()");
  r.build();
  expect_contains(expect_error([&] { r.broadcast_parameters(world()->size()); },
                               ErrorCode::kInvalidArgument),
                  "root " + std::to_string(world()->size()) + " is not a rank");
  StateDict sd = {{"p", Tensor::of(p), {}}};
  expect_contains(expect_error([&] { r.broadcast_state(sd, -1); }, ErrorCode::kInvalidArgument),
                  "root -1 is not a rank");
}

}  // namespace
}  // namespace tutti
