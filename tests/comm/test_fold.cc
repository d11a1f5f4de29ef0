// Small host collectives folded into the agreement check (TUTTI_MPI_FOLD_BYTES,
// docs/communication.md "Agreement checks"), through the public API:
//  * every foldable kind gives its closed form and costs one exchange of
//    the check's schedule (counters: one fold call, no MPI collective, the
//    recursive doubling's messages per rank), larger ops the check then MPI;
//  * ranks that fold differently (a different TUTTI_MPI_FOLD_BYTES; a small
//    op against a large one) get kMismatch on every rank, never a hang or
//    a misread frame, and no rank's output is written;
//  * without the check (TUTTI_CHECK_COLLECTIVES=0) a folded op still
//    refuses frames of different sizes;
//  * a rank that rejected its arguments, and a joined rank (join()), meet a
//    folded op as they meet any other.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "comm/counters.h"
#include "comm/mpi/log_coll.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/fold.h"
#include "comm/op_desc.h"
#include "common/test_util.h"
#include "tutti/config.h"

namespace tutti {
namespace {

namespace counters = comm::counters;
using counters::Protocol;
using test::expect_contains;
using test::expect_error;

// Messages one recursive-doubling exchange sends from `rank` (log_coll.h).
uint64_t rd_messages(int rank, int size) {
  if (size == 1) return 0;
  int pof2 = 1;
  while (pof2 * 2 <= size) pof2 *= 2;
  const int extra = size - pof2, log = mpi::ceil_log2(pof2);
  if (rank < 2 * extra) return rank % 2 ? log + 1 : 1;
  return static_cast<uint64_t>(log);
}

class Fold : public ::testing::Test {
 protected:
  void SetUp() override {
    if (w->size() < 2) GTEST_SKIP() << "needs two or more ranks";
  }
  void TearDown() override {
    unsetenv("TUTTI_MPI_FOLD_BYTES");
    unsetenv("TUTTI_CHECK_COLLECTIVES");
    config::reload();
  }
  // Runs `op` and checks what it cost: `folds` fold exchanges and
  // `mpi_calls` MPI collectives (with a check each).
  void expect_cost(const std::function<void()>& op, uint64_t folds, uint64_t mpi_calls,
                   const std::string& what) {
    counters::reset();
    op();
    const counters::Counts f = counters::get(Protocol::kFold);
    const counters::Counts c = counters::get(Protocol::kCheck);
    EXPECT_EQ(f.calls, folds) << what;
    EXPECT_EQ(f.messages, folds * rd_messages(rank, size)) << what;
    EXPECT_EQ(c.calls, mpi_calls) << what << ": a header-only check per large op";
    EXPECT_EQ(counters::get(Protocol::kMpiCollective).calls, mpi_calls) << what;
    EXPECT_EQ(counters::get(Protocol::kCheckDetail).calls, 0u) << what;
  }
  ProcessGroupPtr w = world();
  int rank = w->rank();
  int size = w->size();
};

TEST_F(Fold, EveryFoldableKindGivesItsClosedFormInOneExchange) {
  // all-reduce: sum, avg (divides once), max, in place and out of place
  std::vector<float> v(100), out(100, -1.0f);
  for (int i = 0; i < 100; ++i) v[i] = static_cast<float>(rank + i);
  expect_cost([&] { w->allreduce(Tensor::of(v), Tensor::of(out), ReduceOp::kSum); }, 1, 0,
              "allreduce");
  const float ranks = static_cast<float>(size * (size - 1) / 2);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(out[i], ranks + size * i) << i;
  std::vector<double> d(7, 2.0 * (rank + 1));
  expect_cost([&] { w->allreduce(Tensor::of(d), ReduceOp::kAvg); }, 1, 0, "avg");
  EXPECT_EQ(d[6], static_cast<double>(size + 1));
  int64_t m = rank * 10;
  w->allreduce(Tensor::of(&m, 1), ReduceOp::kMax);
  EXPECT_EQ(m, (size - 1) * 10);

  // reduce-scatter: block r of sum_q (q + j)
  std::vector<int32_t> in(static_cast<size_t>(3 * size)), block(3, -1);
  std::iota(in.begin(), in.end(), rank);
  expect_cost([&] { w->reduce_scatter(Tensor::of(in), Tensor::of(block), ReduceOp::kSum); },
              1, 0, "reduce_scatter");
  for (int j = 0; j < 3; ++j)
    EXPECT_EQ(block[j], size * (3 * rank + j) + size * (size - 1) / 2) << j;

  // broadcast from the first and the last rank, bytes of every value
  for (int root : {0, size - 1}) {
    std::vector<uint8_t> b(33);
    for (int i = 0; i < 33; ++i) b[i] = static_cast<uint8_t>(rank == root ? 255 - i : rank);
    expect_cost([&] { w->broadcast(Tensor::of(b), root); }, 1, 0, "broadcast");
    for (int i = 0; i < 33; ++i) ASSERT_EQ(b[i], 255 - i) << "root " << root;
  }

  // all-gather (also in place) and all-gatherv with a rank that sends none
  std::vector<int32_t> g(static_cast<size_t>(2 * size), -1);
  std::vector<int32_t> mine = {rank, -rank};
  expect_cost([&] { w->allgather(Tensor::of(mine), Tensor::of(g)); }, 1, 0, "allgather");
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(g[2 * r], r);
    EXPECT_EQ(g[2 * r + 1], -r);
  }
  std::fill(g.begin(), g.end(), -1);
  g[2 * rank] = 5 * rank;
  g[2 * rank + 1] = 7;
  w->allgather(Tensor(g.data() + 2 * rank, DType::kInt32, Shape{2}), Tensor::of(g));
  for (int r = 0; r < size; ++r) EXPECT_EQ(g[2 * r], 5 * r) << "in place";
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) counts[r] = r;  // rank 0 sends nothing
  const int64_t total = size * (size - 1) / 2;
  std::vector<float> piece(static_cast<size_t>(rank), 10.0f * rank), all(total, -1.0f);
  expect_cost([&] { w->allgatherv(Tensor::of(piece), Tensor::of(all), counts); }, 1, 0,
              "allgatherv");
  for (int r = 0, at = 0; r < size; ++r)
    for (int k = 0; k < r; ++k, ++at) ASSERT_EQ(all[at], 10.0f * r) << at;

  // a barrier is the check alone
  expect_cost([&] { w->barrier(); }, 1, 0, "barrier");
}

TEST_F(Fold, LargerOpsRunTheCheckThenMpi) {
  const size_t limit = static_cast<size_t>(config::get_int("TUTTI_MPI_FOLD_BYTES"));
  std::vector<float> v(limit / 4 + 1, 1.0f);
  expect_cost([&] { w->allreduce(Tensor::of(v)); }, 0, 1, "allreduce above the fold");
  EXPECT_EQ(v.back(), static_cast<float>(size));
  // Fewer elements than ranks fold whatever TUTTI_MPI_FOLD_BYTES says.
  setenv("TUTTI_MPI_FOLD_BYTES", "0", 1);
  config::reload();
  std::vector<double> one(static_cast<size_t>(size - 1), 1.0);
  expect_cost([&] { w->allreduce(Tensor::of(one)); }, 1, 0, "fewer elements than ranks");
  EXPECT_EQ(one[0], static_cast<double>(size));
  std::vector<double> many(static_cast<size_t>(size), 1.0);
  expect_cost([&] { w->allreduce(Tensor::of(many)); }, 0, 1, "TUTTI_MPI_FOLD_BYTES=0");
  expect_cost([&] { w->barrier(); }, 1, 0, "barrier with TUTTI_MPI_FOLD_BYTES=0");
}

TEST_F(Fold, RanksThatFoldDifferentlyGetAMismatchNotAHang) {
  // Rank 0 does not fold 1 KiB, the others do: frames of 16 and 1040 bytes.
  if (rank == 0) setenv("TUTTI_MPI_FOLD_BYTES", "512", 1);
  config::reload();
  std::vector<float> v(256, 1.0f), out(256, -7.0f);
  const std::string m = expect_error(
      [&] { w->allreduce(Tensor::of(v), Tensor::of(out), ReduceOp::kSum, {"grad"}); },
      ErrorCode::kMismatch);
  expect_contains(m, "allreduce #");
  expect_contains(m, "'grad'");
  expect_contains(m, "ranks agree on the operation but not on folding its data into the "
                     "agreement check: ");
  expect_contains(m, size == 2 ? "rank 1 sent a frame of 1040 bytes" : "ranks 1, 2");
  expect_contains(m, " of 1040 bytes but rank 0 sent one of 16 bytes");
  expect_contains(m, "TUTTI_MPI_FOLD_BYTES must be the same on every rank");
  expect_contains(m, "; no rank ran it");
  EXPECT_EQ(out[0], -7.0f) << "the output was written";
  unsetenv("TUTTI_MPI_FOLD_BYTES");
  config::reload();
  int32_t one = 1;
  w->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, size);
}

TEST_F(Fold, ASmallOpAgainstALargeOneNamesBoth) {
  // The last rank's op does not fold (header only), the others' does.
  const int64_t n = rank == size - 1 ? 100000 : 4;
  std::vector<float> v(static_cast<size_t>(n), 3.0f);
  const std::string m =
      expect_error([&] { w->allreduce(Tensor::of(v)); }, ErrorCode::kMismatch);
  expect_contains(m, "rank " + std::to_string(size - 1) + " has allreduce #");
  expect_contains(m, "float32 x100000 sum but rank 0 has allreduce #");
  expect_contains(m, "float32 x4 sum; no rank ran it");
  EXPECT_EQ(v[0], 3.0f);
  // Counts that differ by one element inside the fold: today's text.
  std::vector<float> u(rank == size - 1 ? 17 : 16, 1.0f);
  const std::string m2 = expect_error([&] { w->allreduce(Tensor::of(u)); }, ErrorCode::kMismatch);
  expect_contains(m2, "x17 sum but rank 0 has");
  EXPECT_EQ(u[0], 1.0f);
}

TEST_F(Fold, WithoutTheCheckAFoldedOpStillRefusesOtherSizes) {
  setenv("TUTTI_CHECK_COLLECTIVES", "0", 1);
  config::reload();
  std::vector<float> v(16, 2.0f);
  expect_cost([&] { w->allreduce(Tensor::of(v)); }, 1, 0, "unchecked fold");
  EXPECT_EQ(v[15], 2.0f * size);
  std::vector<float> u(rank == size - 1 ? 17 : 16, 1.0f);
  const std::string m = expect_error([&] { w->allreduce(Tensor::of(u)); }, ErrorCode::kMismatch);
  expect_contains(m, "ranks passed different sizes to this operation");
  expect_contains(m, "TUTTI_CHECK_COLLECTIVES=0");
  EXPECT_EQ(u[0], 1.0f);
  w->barrier();
}

TEST_F(Fold, ARankThatRejectsItsArgumentsIsNamed) {
  std::vector<float> in(8, 1.0f), out(rank == 1 ? 9 : 8, -1.0f);
  if (rank == 1) {
    const std::string m = expect_error([&] { w->allreduce(Tensor::of(in), Tensor::of(out), ReduceOp::kSum); },
                                       ErrorCode::kInvalidArgument);
    expect_contains(m, "has 9 elements, expected 8");
  } else {
    const std::string m = expect_error([&] { w->allreduce(Tensor::of(in), Tensor::of(out), ReduceOp::kSum); },
                                       ErrorCode::kMismatch);
    expect_contains(m, "rank 1 rejected the arguments of this operation");
  }
  EXPECT_EQ(out[0], -1.0f);
}

TEST_F(Fold, AJoinedRankServesFoldedOps) {
  auto g = w->split_group(0, rank, "fold/join");
  if (rank == 0) {
    EXPECT_EQ(g->join(), size - 1);
    return;
  }
  // Ranks 1.. run small ops, rank 0 serves them with the identity.
  std::vector<float> v(5, static_cast<float>(rank));
  g->allreduce(Tensor::of(v), ReduceOp::kSum);
  EXPECT_EQ(v[4], static_cast<float>(size * (size - 1) / 2));
  int32_t lo = rank;
  g->allreduce(Tensor::of(&lo, 1), ReduceOp::kMin);
  EXPECT_EQ(lo, 1) << "rank 0 contributed +inf, not 0";
  std::vector<uint8_t> b(9, static_cast<uint8_t>(rank == size - 1 ? 42 : 0));
  g->broadcast(Tensor::of(b), size - 1);
  EXPECT_EQ(b[8], 42);
  g->barrier();
  EXPECT_EQ(g->join(), size - 1);
}

TEST(FoldUnits, PlansPerKind) {
  float x[12] = {0};
  OpRequest r;
  r.kind = CollectiveKind::kAllreduce;
  r.input = r.output = Tensor(x, DType::kFloat32, Shape{12});
  comm::FoldPlan p = comm::fold_plan(r, 1, 4, 48);
  EXPECT_TRUE(p.folds);
  EXPECT_EQ(p.combine, comm::FoldCombine::kReduce);
  EXPECT_EQ(p.bytes, 48u);
  EXPECT_FALSE(comm::fold_plan(r, 1, 4, 47).folds);
  EXPECT_TRUE(comm::fold_plan(r, 1, 13, 0).folds) << "12 elements < 13 ranks";
  r.kind = CollectiveKind::kAllgather;
  r.input = Tensor(x, DType::kFloat32, Shape{3});
  r.output = Tensor(x, DType::kFloat32, Shape{12});
  p = comm::fold_plan(r, 2, 4, 1 << 20);
  EXPECT_EQ(p.combine, comm::FoldCombine::kBitwiseOr);
  EXPECT_EQ(p.bytes, 48u);
  EXPECT_EQ(p.offset, 24u);
  EXPECT_EQ(p.src_bytes, 12u);
  r.kind = CollectiveKind::kBroadcast;
  r.root = 3;
  r.input = r.output = Tensor(x, DType::kFloat32, Shape{12});
  p = comm::fold_plan(r, 2, 4, 1 << 20);
  EXPECT_EQ(p.src_bytes, 0u) << "a non-root contributes zeros";
  r.kind = CollectiveKind::kAlltoall;
  EXPECT_FALSE(comm::fold_plan(r, 0, 4, 1 << 20).folds);
  r.kind = CollectiveKind::kBarrier;
  p = comm::fold_plan(r, 0, 4, 0);
  EXPECT_TRUE(p.folds);
  EXPECT_EQ(p.bytes, 0u);
}

TEST(FoldUnits, LargeAlgorithmSetting) {
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("auto", 2), "1");
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("auto", 8), "1");
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("auto", 9), "3");
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("ring", 1024), "1");
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("rabenseifner", 2), "3");
  EXPECT_EQ(mpi::libnbc_allreduce_algorithm("mpi", 2), "");
  test::expect_error([] { mpi::libnbc_allreduce_algorithm("tree", 2); },
                     ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
