// TP calls fail fast across the TP group, as process-group collectives do:
// an argument error on one TP rank makes its peers, who are waiting in the
// collective that rank will never reach, raise at once (kMismatch naming
// their op and the rank), not after TUTTI_TIMEOUT (this test runs with
// TUTTI_TIMEOUT=60 and allows each call 20 s).  Uniform errors (every rank
// fails the same way) leave each rank its own error and the mesh usable.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tensor_parallel/tp_test_util.h"

namespace tutti {
namespace {

using tptest::expect_error;
using tptest::view;

constexpr int kBadTpRank = 1;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Runs f on every rank; TP rank kBadTpRank is expected to raise
// kInvalidArgument with `bad_parts`, the others kMismatch naming `op` and
// the bad rank.  Every rank must return within 20 s.
void expect_fail_fast(const ProcessMesh& mesh, const std::function<void()>& f,
                      const std::string& op,
                      const std::vector<std::string>& bad_parts) {
  const auto t0 = std::chrono::steady_clock::now();
  if (mesh.tp_rank() == kBadTpRank)
    expect_error(f, ErrorCode::kInvalidArgument, bad_parts);
  else
    expect_error(
        f, ErrorCode::kMismatch,
        {op, "rank " + std::to_string(kBadTpRank) + " rejected the arguments"});
  EXPECT_LT(seconds_since(t0), 20.0) << "peers waited instead of failing fast";
}

TEST(TPFailFast, ShapeErrorOnOneRankFailsEveryRankOfALayer) {
  for (const auto& mesh : tptest::all_meshes()) {
    if (mesh->tp_size() < 2) continue;
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    const int64_t seq_local = 2, h = 6 * p;
    ColumnParallelLinearOptions o;
    o.name = "fc1";
    o.gather_output = false;
    o.sequence_parallel = true;
    ColumnParallelLinear layer(mesh, h, h, o);
    layer.init_from_seed(5);
    std::vector<float> x(seq_local * h, 0.5f), y(seq_local * p * h / p, 0.0f);
    // The bad rank passes an output one row short.
    const int64_t rows = seq_local * p - (mesh->tp_rank() == kBadTpRank);
    expect_fail_fast(
        *mesh,
        [&] {
          layer.forward(view(x, {seq_local, h}), view(y, {rows, h / p}));
        },
        "ColumnParallelLinear 'fc1' forward: sequence-parallel input",
        {"ColumnParallelLinear 'fc1' forward", "output"});
    // The TP group is still usable: a correct call on every rank works.
    y.assign(seq_local * p * h / p, 0.0f);
    layer.forward(view(x, {seq_local, h}), view(y, {seq_local * p, h / p}));
  }
}

TEST(TPFailFast, ShapeErrorOnOneRankFailsEveryRankOfARegion) {
  for (const auto& mesh : tptest::all_meshes()) {
    if (mesh->tp_size() < 2) continue;
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    std::vector<float> part(3 * 4, 1.0f), whole(3 * p * 4, 0.0f);
    const int64_t cols = mesh->tp_rank() == kBadTpRank ? 2 : 4;
    RegionOptions o;
    o.name = "act";
    expect_fail_fast(*mesh,
                     [&] {
                       gather_from_sequence_parallel_forward(
                           *mesh, view(part, {3, cols}),
                           view(whole, {3 * p, 4}), o);
                     },
                     "gather_from_sequence_parallel forward 'act'",
                     {"gather_from_sequence_parallel forward 'act'"});
  }
}

TEST(TPFailFast, TheSameErrorOnEveryRankLeavesEachItsOwnError) {
  for (const auto& mesh : tptest::all_meshes()) {
    SCOPED_TRACE(mesh->str());
    const int p = mesh->tp_size();
    RowParallelLinearOptions o;
    o.name = "fc2";
    o.input_is_parallel = true;
    RowParallelLinear layer(mesh, 4 * p, 4, o);
    std::vector<float> x(3 * 4, 1.0f), y(3 * 4, 0.0f);
    expect_error(
        [&] {
          layer.forward(view(x, {3, 4}), view(y, {2, 4}));
        },
        ErrorCode::kInvalidArgument,
        {"RowParallelLinear 'fc2' forward", "output"});
    layer.forward(view(x, {3, 4}), view(y, {3, 4}));  // still usable
  }
}

}  // namespace
}  // namespace tutti
