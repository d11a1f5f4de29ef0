// join() for uneven inputs: rank r runs r + 1 rounds of collectives and then
// joins, so in round i the ranks i..n-1 run and 0..i-1 serve with the
// reduction's identity.  Every result has a closed form over the running
// ranks; join() returns the last rank to join on every rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace tutti {
namespace {

using test::Buffer;

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                            DType::kFloat64, DType::kInt8,    DType::kUInt8,
                            DType::kInt32,   DType::kInt64};

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat64;
}

// `op` must fail with kMismatch on this (running) rank, and the message
// name the joined rank, what was refused (`why`) and that nobody ran it.
void expect_refused(const std::function<void()>& op, const std::string& why) {
  std::string m;
  try {
    op();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    m = e.what();
  }
  for (const std::string part : {std::string("rank 0 called join()"), why,
                                 std::string("no rank ran it")})
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
}

class Join : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world()->size() < 2) GTEST_SKIP() << "needs two or more ranks";
    g = world()->split_group(0, world()->rank(), "join");
    rank = g->rank();
    n = g->size();
  }
  ProcessGroupPtr g;
  int rank = 0;
  int n = 1;
};

// Round i of the uneven loop: every op and dtype against the ranks i..n-1.
void run_round(Communicator& c, int i, int n, int rank) {
  double sum = 0, prod = 1;
  for (int r = i; r < n; ++r) {
    sum += r + 1;
    prod *= r + 1;
  }
  const std::string where = " in round " + std::to_string(i);
  for (DType d : kAllDTypes) {
    const std::string tag = std::string(dtype_name(d)) + where;
    Buffer b(d, 3);
    b.fill([&](int64_t) { return rank + 1; });
    c.allreduce(b.tensor(), ReduceOp::kSum, OpOptions{"sum"});
    EXPECT_TRUE(test::matches(b, [&](int64_t) { return sum; })) << tag;
    b.fill([&](int64_t) { return rank + 1; });
    c.allreduce(b.tensor(), ReduceOp::kMin, OpOptions{"min"});  // joined: +inf
    EXPECT_TRUE(test::matches(b, [&](int64_t) { return i + 1; })) << tag;
    b.fill([&](int64_t) { return rank + 1; });
    c.allreduce(b.tensor(), ReduceOp::kProd, OpOptions{"prod"});  // joined: 1
    EXPECT_TRUE(test::matches(b, [&](int64_t) { return prod; })) << tag;
    // Negative where the dtype allows: a joined rank's 0 would win.
    const bool neg = d != DType::kUInt8;
    b.fill([&](int64_t) { return neg ? -(rank + 1) : 10 - rank; });
    c.allreduce(b.tensor(), ReduceOp::kMax, OpOptions{"max"});  // joined: -inf
    EXPECT_TRUE(test::matches(b, [&](int64_t) { return neg ? -(i + 1) : 10 - i; }))
        << tag;
    if (is_float(d)) {
      // The average divides by the whole group: joined ranks count as 0.
      b.fill([&](int64_t) { return rank + 1; });
      c.allreduce(b.tensor(), ReduceOp::kAvg, OpOptions{"avg"});
      EXPECT_TRUE(test::matches(b, [&](int64_t) { return sum / n; }, 1e-2)) << tag;
    }
  }
  Buffer empty(DType::kFloat32, 0);
  c.allreduce(empty.tensor(), ReduceOp::kSum, OpOptions{"empty"});
  // A broadcast from the last rank (which joins last) reaches every
  // running rank; the joined ones drop it.
  Buffer b(DType::kInt32, 4);
  b.fill([&](int64_t k) { return rank == n - 1 ? 100 * i + k : -1; });
  c.broadcast(b.tensor(), n - 1, OpOptions{"bcast"});
  EXPECT_TRUE(test::matches(b, [&](int64_t k) { return 100 * i + k; })) << where;
  c.barrier();
}

TEST_F(Join, UnevenRoundsSeeTheRunningRanksOnly) {
  for (int i = 0; i <= rank; ++i) run_round(*g, i, n, rank);
  EXPECT_EQ(g->join(), n - 1);
  // The group is usable after the join, and every rank counted alike.
  int64_t one = 1;
  g->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, n);
}

// The reducer's launch channels: a same-membership split carries
// collectives while a rank is joined on its parent.
TEST_F(Join, SameMembershipSplitsAreServed) {
  auto channel = g->split_group(0, rank, "join/channel");
  ASSERT_EQ(channel->size(), n);
  for (int i = 0; i <= rank; ++i) {
    run_round(*channel, i, n, rank);
    run_round(*g, i, n, rank);
  }
  EXPECT_EQ(g->join(), n - 1);
}

// An op a joined rank cannot serve: kMismatch on every running rank naming
// the joined rank; the joined rank stays in join() and serves what follows.
TEST_F(Join, RefusedKindsAreAMismatchOnTheRunningRanks) {
  if (rank == 0) {
    EXPECT_EQ(g->join(), n - 1);
    return;
  }
  std::vector<float> in(2, 1.0f), out(2 * n);
  const std::string no_identity = "has no identity a joined rank could contribute";
  expect_refused([&] { g->allgather(Tensor::of(in), Tensor::of(out)); },
                 "allgather #");
  std::vector<float> rs_in(n), rs_out(1);
  expect_refused([&] { g->reduce_scatter(Tensor::of(rs_in), Tensor::of(rs_out)); },
                 no_identity);
  expect_refused([&] { g->broadcast(Tensor::of(in), 0); }, "its root, rank 0, has joined");
  expect_refused([&] { g->split_group(0, rank, "join/refused"); }, "split #");
  // Still served afterwards: the sum over ranks 1..n-1 of rank.
  int32_t v = rank;
  g->allreduce(Tensor::of(&v, 1));
  EXPECT_EQ(v, n * (n - 1) / 2);
  EXPECT_EQ(g->join(), n - 1);
}

// Ties (no op between two joins) go to the highest rank; a later joiner
// beats a higher rank that joined earlier.
TEST_F(Join, LastJoinerIsTheOneThatRanLongest) {
  EXPECT_EQ(g->join(), n - 1);  // everyone joins at once: a tie
  if (rank == 0) {  // rank 0 alone runs one more op; the others serve it
    int32_t v = 5;
    g->allreduce(Tensor::of(&v, 1));
    EXPECT_EQ(v, 5);
  }
  EXPECT_EQ(g->join(), 0);
}

// A split destroyed on one rank before the join (Python frees a dropped
// model whenever its garbage collector runs) cannot see every rank join:
// join() completes anyway and gives it up on the ranks that still hold it.
TEST_F(Join, ASplitDroppedOnOneRankIsGivenUp) {
  auto dropped = g->split_group(0, rank, "join/dropped");
  if (rank == 0) dropped.reset();
  EXPECT_EQ(g->join(), n - 1);
  if (rank != 0) {
    try {
      dropped->barrier();
      ADD_FAILURE() << "a given-up split still ran a barrier";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    }
  }
  int32_t one = 1;
  g->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, n);
  // A later join() leaves the given-up split alone: it used to start a
  // loop on it too, which failed at once (kAborted), so join() raised while
  // its loop on the group went on serving ops nobody ran (the next test's
  // collectives then met it: a segfault in the Python suite).
  EXPECT_EQ(g->join(), n - 1);
  one = 1;
  g->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, n);
}

// Splits freed on different ranks (each rank's garbage collector ran at its
// own time): rank 0 still holds A, the others B.  No joined rank may post
// its check on a split some member has freed (erroneous in MPI: Open MPI
// queues the fragments under the freed context id), so join() asks the
// members first and gives such a split up without touching it; the group
// and new splits then work as before.
TEST_F(Join, SplitsFreedOnDifferentRanksAreNotServed) {
  auto a = g->split_group(0, rank, "join/a");
  auto b = g->split_group(0, rank, "join/b");
  if (rank == 0)
    b.reset();
  else
    a.reset();
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(g->join(), n - 1);
    int32_t v = rank;
    g->allreduce(Tensor::of(&v, 1));
    EXPECT_EQ(v, n * (n - 1) / 2);
  }
  auto& held = rank == 0 ? a : b;
  try {
    held->barrier();
    ADD_FAILURE() << "a given-up split still ran a barrier";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
  }
  held.reset();
  for (int k = 0; k < 4; ++k) {
    auto fresh = g->split_group(0, rank, "join/fresh" + std::to_string(k));
    int32_t v = rank + k;
    fresh->allreduce(Tensor::of(&v, 1));
    EXPECT_EQ(v, n * (n - 1) / 2 + n * k) << "split " << k;
    EXPECT_EQ(fresh->join(), n - 1);
  }
}

// Without the agreement check nothing tells a joined rank what runs: every
// rank refuses at once (no collective), and the group stays usable.
TEST_F(Join, RefusedWithoutTheAgreementCheck) {
  setenv("TUTTI_CHECK_COLLECTIVES", "0", 1);
  config::reload();
  try {
    g->join();
    ADD_FAILURE() << "join() ran without the agreement check";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("TUTTI_CHECK_COLLECTIVES=0"), std::string::npos)
        << e.what();
  }
  unsetenv("TUTTI_CHECK_COLLECTIVES");
  config::reload();
  EXPECT_EQ(g->join(), n - 1);
}

}  // namespace
}  // namespace tutti
