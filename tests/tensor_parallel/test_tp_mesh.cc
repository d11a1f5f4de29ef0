// ProcessMesh: the TP x DP layout, group membership in world ranks, and the
// errors for sizes that do not divide or ranks that disagree.
#include <gtest/gtest.h>

#include <string>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

TEST(ProcessMesh, TpIsInnermostAndGroupsHoldTheExpectedWorldRanks) {
  const int n = world()->size(), me = world()->rank();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    SCOPED_TRACE("tp_size " + std::to_string(tp));
    ProcessMesh mesh(world(), tp);
    EXPECT_EQ(mesh.tp_size(), tp);
    EXPECT_EQ(mesh.dp_size(), n / tp);
    EXPECT_EQ(mesh.tp_rank(), me % tp);
    EXPECT_EQ(mesh.dp_rank(), me / tp);
    EXPECT_EQ(mesh.rank_of(mesh.dp_rank(), mesh.tp_rank()), me);
    EXPECT_EQ(mesh.str(),
              "TP " + std::to_string(tp) + " x DP " + std::to_string(n / tp));
    EXPECT_EQ(mesh.tp_group()->name(), "tp");
    EXPECT_EQ(mesh.dp_group()->name(), "dp");
    ASSERT_EQ(mesh.tp_group()->size(), tp);
    ASSERT_EQ(mesh.dp_group()->size(), n / tp);
    // TP peers are consecutive world ranks; DP peers are tp_size apart.
    for (int i = 0; i < tp; ++i)
      EXPECT_EQ(mesh.tp_group()->world_rank(i), mesh.dp_rank() * tp + i);
    for (int j = 0; j < n / tp; ++j)
      EXPECT_EQ(mesh.dp_group()->world_rank(j), j * tp + mesh.tp_rank());
    // The groups communicate: sums of world ranks have closed forms.
    int64_t v = me;
    mesh.tp_group()->allreduce(Tensor::of(&v, 1));
    const int64_t base = static_cast<int64_t>(mesh.dp_rank()) * tp;
    EXPECT_EQ(v, base * tp + static_cast<int64_t>(tp) * (tp - 1) / 2);
    v = me;
    mesh.dp_group()->allreduce(Tensor::of(&v, 1));
    const int64_t d = n / tp;
    EXPECT_EQ(v,
              static_cast<int64_t>(tp) * d * (d - 1) / 2 + d * mesh.tp_rank());
    // One machine: every TP group is within the node.
    EXPECT_TRUE(mesh.tp_within_node());
    tptest::expect_error([&] { mesh.rank_of(n / tp, 0); },
                         ErrorCode::kInvalidArgument,
                         {"no position", "dp " + std::to_string(n / tp)});
  }
}

TEST(ProcessMesh, SizesThatDoNotDivideAreClearErrorsOnEveryRank) {
  const int n = world()->size();
  for (int tp : {0, -1, n + 1, 3, 5}) {
    if (tp > 0 && n % tp == 0) continue;
    SCOPED_TRACE("tp_size " + std::to_string(tp));
    tptest::expect_error(
        [&] { ProcessMesh mesh(world(), tp); }, ErrorCode::kInvalidArgument,
        {"tp_size " + std::to_string(tp), "divide the group size",
         std::to_string(n) + " ranks"});
  }
  tptest::expect_error([&] { ProcessMesh mesh(nullptr, 1); },
                       ErrorCode::kInvalidArgument, {"world group"});
  // The world is still healthy: every rank reached the same point.
  EXPECT_TRUE(test::all_ranks_ok(true));
}

TEST(ProcessMesh, RanksDisagreeingOnTpSizeFailTogether) {
  const int n = world()->size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int tp = world()->rank() == 0 ? 1 : n;
  tptest::expect_error(
      [&] { ProcessMesh mesh(world(), tp); }, ErrorCode::kMismatch,
      {"different tp_size", "between 1 and " + std::to_string(n)});
  EXPECT_TRUE(test::all_ranks_ok(true));
}

TEST(ProcessMesh, MeshesOverASubgroupUseItsRanks) {
  // Split the world into halves (or one group for odd sizes) and build a
  // TP mesh inside each: the mesh works on any group, not only the world.
  const int n = world()->size(), me = world()->rank();
  const int half = n % 2 == 0 ? n / 2 : n;
  auto sub = world()->split_group(me / half, me, "half");
  ProcessMesh mesh(sub, half);
  EXPECT_EQ(mesh.tp_size(), half);
  EXPECT_EQ(mesh.dp_size(), 1);
  EXPECT_EQ(mesh.tp_rank(), me % half);
  EXPECT_EQ(mesh.tp_group()->world_rank(0), (me / half) * half);
}

TEST(ProcessMesh, CommStatsCountWhatTheRegionOperatorsPass) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    std::vector<float> a(6 * p, 1.0f), b(6 * p);
    mesh->reset_comm_stats();
    reduce_from_tp_forward(*mesh, tptest::view(a, {6 * p}),
                           tptest::view(b, {6 * p}));
    gather_from_tp_forward(*mesh, tptest::view(a, {2, 3}),
                           tptest::view(b, {2, 3 * p}));
    reduce_scatter_to_sequence_parallel_forward(
        *mesh, tptest::view(a, {3 * p, 2}), tptest::view(b, {3, 2}));
    const CommStats s = mesh->comm_stats();
    const uint64_t one = p > 1 ? 1 : 0;
    EXPECT_EQ(s.allreduce_calls, one);
    EXPECT_EQ(s.allreduce_bytes, one * 6 * p * sizeof(float));
    EXPECT_EQ(s.allgather_calls, one);
    EXPECT_EQ(s.allgather_bytes, one * 6 * p * sizeof(float));
    EXPECT_EQ(s.reduce_scatter_calls, one);
    EXPECT_EQ(s.reduce_scatter_bytes, one * 6 * p * sizeof(float));
    EXPECT_EQ(s.calls(), 3 * one);
    EXPECT_EQ(s.bytes(), 3 * one * 6 * p * sizeof(float));
    mesh->reset_comm_stats();
    EXPECT_EQ(mesh->comm_stats().bytes(), 0u);
  }
}

}  // namespace
}  // namespace tutti
