// Hierarchical all-reduce: nodes from MPI's shared-memory split (one host:
// the node is the whole world) and forced splits into "nodes" of 1, 2 or 3
// consecutive ranks, which at -np 3/4 give equal nodes (reduce-scatter ->
// cross-node all-reduce -> all-gather) and unequal ones (node all-reduce ->
// leader all-reduce -> node broadcast).  Results are exact on integer data,
// bit-identical across ranks on random data, and the world communicator
// sees no bucket collective (they run on the node and cross groups).
#include <gtest/gtest.h>

#include <random>

#include "data_parallel/dp_test_util.h"

namespace tutti {
namespace {

using test::ParamDecl;

// Odd sizes so buckets need padding to a multiple of the node size.
const std::vector<ParamDecl> kParams = {
    {"w1", DType::kFloat32, Shape{13, 7}}, {"b1", DType::kFloat32, Shape{13}},
    {"w2", DType::kFloat16, Shape{5, 3}},  {"b2", DType::kFloat64, Shape{3}},
    {"w3", DType::kFloat32, Shape{1001}},  {"e", DType::kFloat32, Shape{0}}};

class Hierarchical : public ::testing::TestWithParam<int> {};

TEST_P(Hierarchical, ExactAveragesAndNoWorldCollectives) {
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.hierarchical = true;
  o.hierarchical_node_size = GetParam();
  o.bucket_cap_mb = 256.0 / (1 << 20);
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  const int rank = world()->rank(), n = world()->size();
  for (int step = 0; step < 2; ++step) {
    for (size_t p = 0; p < params.size(); ++p)
      params[p].grad.fill([&](int64_t i) { return test::grad_value(rank, static_cast<int>(p) + step, i); });
    const uint64_t before = test::world_collective_seq();
    for (int i = r.num_parameters() - 1; i >= 0; --i) r.grad_ready(i);
    EXPECT_TRUE(r.synchronize());
    // +1: world_collective_seq() itself; step 0 of n > 1 ranks also checks
    // the replicas (one 8-byte allgather on the group) and agrees on the
    // learned bucket order (one broadcast on the group), once.
    const uint64_t order = step == 0 && n > 1 ? 2 : 0;
    EXPECT_EQ(test::world_collective_seq(), before + 1 + order)
        << (n > 1 ? "bucket collectives ran on the world" : "");
    for (size_t p = 0; p < params.size(); ++p)
      EXPECT_TRUE(test::matches(params[p].grad, [&](int64_t i) {
        double sum = 0;
        for (int k = 0; k < n; ++k)
          sum += test::stored(params[p].grad.dtype, test::grad_value(k, static_cast<int>(p) + step, i));
        return test::expected_avg(params[p].grad.dtype, sum, n);
      })) << params[p].name << " step " << step;
  }
}

TEST_P(Hierarchical, BitIdenticalAcrossRanks) {
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.hierarchical = true;
  o.hierarchical_node_size = GetParam();
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  std::mt19937 rng(5 + world()->rank());
  std::uniform_real_distribution<double> u(-100, 100);
  for (auto& p : params) p.grad.fill([&](int64_t) { return u(rng); });
  for (int i = 0; i < r.num_parameters(); ++i) r.grad_ready(i);
  r.synchronize();
  std::vector<unsigned char> bytes;
  for (auto& p : params) bytes.insert(bytes.end(), p.grad.bytes.begin(), p.grad.bytes.end());
  EXPECT_TRUE(test::same_on_every_rank(bytes));
}

// 0: MPI shared-memory split; 1: every rank a node; 2, 3: forced nodes.
INSTANTIATE_TEST_SUITE_P(NodeSizes, Hierarchical, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace tutti
