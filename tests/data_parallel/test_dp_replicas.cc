// The replica check (issue 27, ReducerOptions::check_parameters): at the end
// of the first reducing synchronize() every rank compares a digest of its
// parameters with the others' (one small all-reduce of the digest and its complement) and, when they differ,
// every rank raises kMismatch naming the first differing parameter and the
// ranks.  Over the reducer's own group only (tensor-parallel shards differ
// across groups), once, and not at all when turned off.  Run at -np 2, 3, 4.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "data_parallel/dp_test_util.h"
#include "data_parallel/param_check.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;
using test::ParamDecl;
using test::TestParam;

const std::vector<ParamDecl> kDecls = {
    {"w1", DType::kFloat32, Shape{4, 3}},
    {"b1", DType::kFloat16, Shape{3}},
    {"w2", DType::kBFloat16, Shape{2, 5}},
};

ReducerOptions opts(bool check) {
  ReducerOptions o;
  o.check_parameters = check;
  return o;
}

// Parameters: element i of parameter p is p + i / 8 on every rank (`tweak`
// adds 1 to element `at` of parameter `param` on the ranks `on` says).
std::vector<TestParam> make(int param = -1, int64_t at = 0,
                            const std::function<bool(int)>& on = nullptr) {
  auto params = test::make_params(kDecls);
  const int rank = world()->rank();
  for (size_t p = 0; p < params.size(); ++p) {
    Tensor t = params[p].param_tensor();
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p) + i / 8.0;
    if (static_cast<int>(p) == param && on && on(rank)) v[static_cast<size_t>(at)] += 1;
    convert(v.data(), DType::kFloat64, t.data(), t.dtype(), v.size());
    Tensor g = params[p].grad_tensor();
    std::vector<double> gv(static_cast<size_t>(g.numel()), rank + 1.0);
    convert(gv.data(), DType::kFloat64, g.data(), g.dtype(), gv.size());
  }
  return params;
}

void step(Reducer& r) {
  for (int p = r.num_parameters() - 1; p >= 0; --p) r.grad_ready(p);
}

TEST(Replicas, DifferingParameterFailsOnEveryRankNamingIt) {
  const int w = world()->size();
  // Parameter #1 'b1' differs on the last rank, element 2.
  auto params = make(1, 2, [&](int r) { return r == w - 1; });
  Reducer reducer(world(), opts(true));
  test::register_all(reducer, params);
  reducer.build();
  step(reducer);
  const std::string m = expect_error([&] { reducer.synchronize(); }, ErrorCode::kMismatch);
  expect_contains(m, "rank " + std::to_string(world()->rank()) + ": Reducer 'dp'");
  expect_contains(m, "parameter #1 'b1' float16[3] of rank " + std::to_string(w - 1) +
                         " differs from rank 0's");
  expect_contains(m, "1 of 3 parameters differ, on rank " + std::to_string(w - 1));
  expect_contains(m, "broadcast_parameters");
  // The reduction itself completed before the check: the averages are in.
  const double avg = (w + 1) / 2.0;
  for (auto& p : params)
    for (double x : p.grad.values()) EXPECT_EQ(x, test::stored(p.grad.dtype, avg));
  // Once: the next step does not check again (no error).
  step(reducer);
  EXPECT_TRUE(reducer.synchronize());
}

TEST(Replicas, SeveralParametersAndRanksDiffer) {
  const int w = world()->size();
  // 'w1' (#0) differs on every odd rank, element 11; 'w2' on rank 1 too.
  auto params = make(0, 11, [](int r) { return r % 2 == 1; });
  if (world()->rank() == 1) {
    Tensor t = params[2].param_tensor();
    std::vector<double> v(static_cast<size_t>(t.numel()), -3.0);
    convert(v.data(), DType::kFloat64, t.data(), t.dtype(), v.size());
  }
  Reducer reducer(world(), opts(true));
  test::register_all(reducer, params);
  reducer.build();
  step(reducer);
  const std::string m = expect_error([&] { reducer.synchronize(); }, ErrorCode::kMismatch);
  std::string odd;
  for (int r = 1; r < w; r += 2) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
  const std::string ranks = (w > 3 ? "ranks " : "rank ") + odd;
  expect_contains(m, "parameter #0 'w1' float32[4, 3] of " + ranks + " differs from rank 0's");
  expect_contains(m, "2 of 3 parameters differ, on " + ranks);
}

TEST(Replicas, AgreeingReplicasCostOneCollectiveOnce) {
  // The check adds one world collective (the all-reduce of the digest and its complement) to
  // the first reducing step and none to later ones.
  auto count = [](bool check, std::vector<uint64_t>* per_step) {
    auto params = make();
    ReducerOptions o = opts(check);
    o.launch_channels = 1;  // every bucket on the world: counted too, alike
    Reducer reducer(world(), o);
    test::register_all(reducer, params);
    reducer.build();
    for (int s = 0; s < 2; ++s) {
      const uint64_t before = test::world_collective_seq();
      step(reducer);
      EXPECT_TRUE(reducer.synchronize());
      per_step->push_back(test::world_collective_seq() - before);
    }
  };
  std::vector<uint64_t> on, off;
  count(true, &on);
  count(false, &off);
  EXPECT_EQ(on[0], off[0] + 1);
  EXPECT_EQ(on[1], off[1]);
}

TEST(Replicas, CheckedOverTheReducersGroupOnly) {
  // Groups of two consecutive ranks, as the data-parallel groups of a mesh
  // whose tensor-parallel shards differ: the parameters differ across
  // groups but agree within each, so no group fails.
  const int rank = world()->rank();
  auto group = world()->split_group(rank / 2, rank, "replicas.dp");
  auto params = make(0, 0, [](int r) { return r / 2 == 1; });
  Reducer reducer(group, opts(true));
  test::register_all(reducer, params);
  reducer.build();
  step(reducer);
  EXPECT_TRUE(reducer.synchronize());
  // Within a group they must agree: the second rank of each pair differs.
  auto odd = make(2, 0, [](int r) { return r % 2 == 1; });
  Reducer second(group, opts(true));
  test::register_all(second, odd);
  second.build();
  step(second);
  if (group->size() == 1) {
    EXPECT_TRUE(second.synchronize());
  } else {
    const std::string m = expect_error([&] { second.synchronize(); }, ErrorCode::kMismatch);
    expect_contains(m, "parameter #2 'w2' bfloat16[2, 5] of rank 1 of group '");
  }
}

TEST(Replicas, TurnedOffTheReplicasMayDiffer) {
  auto params = make(1, 0, [](int r) { return r == 1; });
  Reducer reducer(world(), opts(false));
  test::register_all(reducer, params);
  reducer.build();
  step(reducer);
  EXPECT_TRUE(reducer.synchronize());
  // The setting must agree across ranks: it is part of build()'s check.
  if (world()->size() > 1) {
    Reducer mixed(world(), opts(world()->rank() != 0));
    auto p2 = make();
    test::register_all(mixed, p2);
    expect_contains(expect_error([&] { mixed.build(); }, ErrorCode::kMismatch),
                    "check_parameters=");
  }
}

TEST(Replicas, DigestIsXxh64) {
  // Known answers of XXH64 (tests/checkpoint/xxh64.py computes the same),
  // so every rank, build and machine digests alike.
  EXPECT_EQ(dp::digest_bytes("", 0), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(dp::digest_bytes("abc", 3), 0x44BC2CF5AD770999ull);
  std::vector<unsigned char> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(dp::digest_bytes(bytes.data(), 100, 7), 0x80653E7E9B887CDDull);
  EXPECT_EQ(dp::digest_bytes(bytes.data(), 37), 0xD93FA2DFEE5C24C9ull);
  // A parameter's digest changes with any one bit.
  std::vector<float> v(1000, 0.25f);
  const uint64_t d = dp::digest_tensor(Tensor::of(v), nullptr);
  v[777] = std::nextafter(0.25f, 1.0f);
  EXPECT_NE(dp::digest_tensor(Tensor::of(v), nullptr), d);
}

}  // namespace
}  // namespace tutti
