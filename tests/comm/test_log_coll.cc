// tutti's own log-round schedules (src/comm/mpi/log_coll.h) on raw MPI
// communicators, at 1-8 ranks (powers of two and not):
//  * recursive-doubling all-reduce of every dtype x op x size (0, 1, odd,
//    16 KiB) against the CPU reference folded in rank order, with
//    rank-distinct inputs exact in every dtype; every rank gets the same
//    bits (also for min/max of -0/+0 and NaN payloads, where the op is not
//    bitwise commutative);
//  * rounds and messages per rank in closed form (ceil(log2 W), plus the
//    fold of a non-power-of-two W), from the schedule and the counters;
//  * several schedules in flight on one communicator, advanced in a
//    rank-dependent order;
//  * frames of different sizes (and ones that do not fit the receive
//    buffer) reach every rank as a size difference, never a misread frame;
//  * Bruck all-gather: blocks in rank order, ceil(log2 W) rounds.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/counters.h"
#include "comm/mpi/log_coll.h"
#include "comm/mpi/mpi_runtime.h"
#include "common/test_util.h"
#include "core/cpu_reduce.h"

namespace tutti {
namespace mpi {
namespace {

using comm::counters::Protocol;

// The schedules count under the check's id here (the library's only user).
constexpr Protocol kProto = Protocol::kCheck;

// Payload only: the reduce of (dtype, op); a size difference is recorded.
class ReduceOps : public FrameOps {
 public:
  ReduceOps(DType d, ReduceOp op) : dtype_(d), op_(op) {}
  void combine(const void* second, void* first, size_t bytes) const override {
    reduce_inplace(dtype_, op_, second, first, bytes / dtype_size(dtype_));
  }
  void size_differs(void*, size_t) const override { differed = true; }
  mutable bool differed = false;

 private:
  DType dtype_;
  ReduceOp op_;
};

// An 8-byte header word combined by MAX ahead of a sum of int32: a size
// difference sets the word to all ones, as the agreement check does.
class HeaderOps : public FrameOps {
 public:
  void combine(const void* second, void* first, size_t bytes) const override {
    uint64_t a, b;
    std::memcpy(&a, first, 8);
    std::memcpy(&b, second, 8);
    a = std::max(a, b);
    std::memcpy(first, &a, 8);
    reduce_inplace(DType::kInt32, ReduceOp::kSum, static_cast<const char*>(second) + 8,
                   static_cast<char*>(first) + 8, (bytes - 8) / 4);
  }
  void size_differs(void* mine, size_t) const override {
    const uint64_t all = ~uint64_t{0};
    std::memcpy(mine, &all, 8);
  }
};

// Closed forms of the recursive doubling (log_coll.h).
struct RdCost {
  int rounds, messages;
};
RdCost rd_cost(int rank, int size) {
  if (size == 1) return {0, 0};
  int pof2 = 1;
  while (pof2 * 2 <= size) pof2 *= 2;
  const int extra = size - pof2, log = ceil_log2(pof2);
  if (rank < 2 * extra) return rank % 2 ? RdCost{log + 2, log + 1} : RdCost{2, 1};
  return {log, log};
}

uint64_t hash_bytes(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

class LogColl : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  void TearDown() override { MPI_Comm_free(&comm); }

  // Every rank's result hash is the same.
  bool same_everywhere(const void* p, size_t n) {
    uint64_t h = hash_bytes(p, n);
    std::vector<uint64_t> all(static_cast<size_t>(size));
    MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm);
    return std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == h; });
  }
  // Runs a schedule to completion.
  static void run(Schedule& s) {
    for (long i = 0; !s.test(); ++i)
      ASSERT_LT(i, 200000000L) << "schedule did not complete";
  }

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

// Rank r's input: exact in every dtype, and products stay exact (|x| <= 2^8
// over 8 ranks for prod).
double input(ReduceOp op, int r, int64_t i) {
  if (op == ReduceOp::kProd) return ((i + r) % 3 == 0) ? 2.0 : ((i + r) % 3 == 1 ? 1.0 : -1.0);
  return test::rank_value(r, i);
}

TEST_F(LogColl, AllreduceEveryDtypeOpAndSizeMatchesTheReferenceOnEveryRank) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                          DType::kInt8,    DType::kUInt8,   DType::kInt32,   DType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  for (DType d : dtypes) {
    const int64_t big = 16384 / static_cast<int64_t>(dtype_size(d));
    for (ReduceOp op : ops) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, big}) {
        SCOPED_TRACE(testing::Message() << dtype_name(d) << " " << reduce_op_name(op) << " x" << n);
        // The reference: every rank's input, reduced in rank order.
        test::Buffer expect(d, n), mine(d, n);
        expect.fill([&](int64_t i) { return input(op, 0, i); });
        for (int r = 1; r < size; ++r) {
          test::Buffer other(d, n);
          other.fill([&](int64_t i) { return input(op, r, i); });
          reduce_inplace(d, op, other.bytes.data(), expect.bytes.data(), static_cast<size_t>(n));
        }
        mine.fill([&](int64_t i) { return input(op, rank, i); });
        ReduceOps fops(d, op);
        const size_t bytes = mine.bytes.size();
        RdAllreduce rd(comm, ScheduleTags::next_post(comm), 0, bytes, bytes, fops, kProto);
        if (bytes) std::memcpy(rd.frame(), mine.bytes.data(), bytes);
        rd.start();
        run(rd);
        EXPECT_FALSE(fops.differed);
        EXPECT_TRUE(bytes == 0 || std::memcmp(rd.result(), expect.bytes.data(), bytes) == 0);
        EXPECT_TRUE(same_everywhere(rd.result(), bytes));
      }
    }
  }
}

TEST_F(LogColl, NotBitwiseCommutativeMinMaxStillGiveOneResult) {
  // -0 and +0, and NaNs with rank-distinct payloads: f(a, b) and f(b, a)
  // differ in bits, so ranks agree only if they evaluate one tree.
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<uint32_t> v = {rank % 2 ? 0x80000000u : 0u, 0x7fc00000u | static_cast<uint32_t>(rank + 1),
                               rank % 2 ? 0u : 0x80000000u};
    ReduceOps fops(DType::kFloat32, op);
    RdAllreduce rd(comm, ScheduleTags::next_post(comm), 0, 12, 12, fops, kProto);
    std::memcpy(rd.frame(), v.data(), 12);
    rd.start();
    run(rd);
    float out[3];
    std::memcpy(out, rd.result(), 12);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_TRUE(same_everywhere(rd.result(), 12)) << reduce_op_name(op);
  }
}

TEST_F(LogColl, RoundsAndMessagesPerRankHaveTheClosedForm) {
  const RdCost want = rd_cost(rank, size);
  comm::counters::reset();
  ReduceOps fops(DType::kInt64, ReduceOp::kSum);
  const int reps = 5;
  for (int k = 0; k < reps; ++k) {
    int64_t x = rank + 1;
    RdAllreduce rd(comm, ScheduleTags::next_post(comm), 0, 8, 8, fops, kProto);
    std::memcpy(rd.frame(), &x, 8);
    rd.start();
    run(rd);
    std::memcpy(&x, rd.result(), 8);
    EXPECT_EQ(x, static_cast<int64_t>(size) * (size + 1) / 2);
    EXPECT_EQ(rd.rounds_done(), want.rounds) << "rank " << rank << " of " << size;
  }
  const comm::counters::Counts c = comm::counters::get(kProto);
  EXPECT_EQ(c.calls, static_cast<uint64_t>(reps));
  EXPECT_EQ(c.rounds, static_cast<uint64_t>(reps * want.rounds));
  EXPECT_EQ(c.messages, static_cast<uint64_t>(reps * want.messages));
  EXPECT_EQ(c.bytes, static_cast<uint64_t>(reps * want.messages * 8));
  // Logarithmic: no rank takes more than ceil(log2 W) + 1 rounds (+2 with
  // the fold below a power of two); the ring took 2(W-1).
  EXPECT_LE(want.rounds, ceil_log2(size) + 1);
}

TEST_F(LogColl, SchedulesInFlightAdvanceInAnyOrder) {
  constexpr int kN = 6;
  ReduceOps fops(DType::kInt32, ReduceOp::kSum);
  std::vector<std::unique_ptr<RdAllreduce>> rds;
  for (int k = 0; k < kN; ++k) {
    // Posted in the same order on every rank, sizes differ per schedule.
    const size_t n = static_cast<size_t>(k * 37 + 1);
    rds.emplace_back(new RdAllreduce(comm, ScheduleTags::next_post(comm), 0, n * 4, n * 4,
                                     fops, kProto));
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i) * (rank + 1) + k;
    std::memcpy(rds.back()->frame(), v.data(), n * 4);
    rds.back()->start();
  }
  // Rank-dependent order: even ranks finish the last first, odd ranks
  // interleave one test each.
  if (rank % 2 == 0) {
    for (int k = kN - 1; k >= 0; --k) run(*rds[static_cast<size_t>(k)]);
  } else {
    bool all = false;
    for (long it = 0; !all; ++it) {
      ASSERT_LT(it, 200000000L);
      all = true;
      for (auto& r : rds) all = r->test() && all;
    }
  }
  const int32_t ranks_sum = size * (size + 1) / 2;
  for (int k = 0; k < kN; ++k) {
    const size_t n = static_cast<size_t>(k * 37 + 1);
    const auto* got = static_cast<const int32_t*>(rds[static_cast<size_t>(k)]->result());
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(got[i], static_cast<int32_t>(i) * ranks_sum + k * size) << "schedule " << k;
  }
}

TEST_F(LogColl, FramesOfAnotherSizeReachEveryRankAsADifference) {
  if (size < 2) GTEST_SKIP() << "needs two or more ranks";
  // The last rank's frame is larger: with room for it (received, counted
  // as different) and without (MPI_ERR_TRUNCATE), every rank's header ends
  // all ones; with equal sizes it is the plain maximum.
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    const size_t base = 8 + 32;
    const size_t bytes = variant > 0 && rank == size - 1 ? base + 16 : base;
    const size_t capacity = variant == 1 ? base + 16 : base;
    HeaderOps ops;
    RdAllreduce rd(comm, ScheduleTags::next_post(comm), 0, bytes, capacity, ops, kProto);
    std::memset(rd.frame(), 0, bytes);
    const uint64_t h = 100 + static_cast<uint64_t>(rank);
    std::memcpy(rd.frame(), &h, 8);
    rd.start();
    run(rd);
    uint64_t got;
    std::memcpy(&got, rd.result(), 8);
    EXPECT_EQ(got, variant == 0 ? 100 + static_cast<uint64_t>(size - 1) : ~uint64_t{0});
  }
  // The communicator stays usable.
  ReduceOps fops(DType::kInt32, ReduceOp::kSum);
  RdAllreduce rd(comm, ScheduleTags::next_post(comm), 0, 4, 4, fops, kProto);
  const int32_t one = 1;
  std::memcpy(rd.frame(), &one, 4);
  rd.start();
  run(rd);
  int32_t sum;
  std::memcpy(&sum, rd.result(), 4);
  EXPECT_EQ(sum, size);
}

TEST_F(LogColl, BruckAllgatherInRankOrderInLogRounds) {
  for (size_t block : {size_t{0}, size_t{1}, size_t{40}, size_t{4096}}) {
    std::vector<unsigned char> mine(block);
    for (size_t i = 0; i < block; ++i) mine[i] = static_cast<unsigned char>(rank * 31 + i);
    comm::counters::reset();
    BruckAllgather g(comm, ScheduleTags::next_post(comm), 1, mine.data(), block, kProto);
    run(g);
    const auto* out = static_cast<const unsigned char*>(g.result());
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < block; ++i)
        ASSERT_EQ(out[static_cast<size_t>(r) * block + i], static_cast<unsigned char>(r * 31 + i))
            << "block of rank " << r << ", byte " << i;
    EXPECT_EQ(g.rounds_done(), ceil_log2(size));
    EXPECT_EQ(comm::counters::get(kProto).messages, static_cast<uint64_t>(ceil_log2(size)));
  }
}

TEST(LogCollUnits, CeilLog2AndTags) {
  EXPECT_EQ(ceil_log2(1), 0);
  EXPECT_EQ(ceil_log2(2), 1);
  EXPECT_EQ(ceil_log2(3), 2);
  EXPECT_EQ(ceil_log2(8), 3);
  EXPECT_EQ(ceil_log2(9), 4);
  // Distinct tags per (post, step, round) within the space, all legal.
  EXPECT_NE(ScheduleTags::tag(0, 0, 1), ScheduleTags::tag(1, 0, 1));
  EXPECT_NE(ScheduleTags::tag(0, 0, 1), ScheduleTags::tag(0, 1, 1));
  EXPECT_NE(ScheduleTags::tag(0, 0, 1), ScheduleTags::tag(0, 0, 2));
  EXPECT_GE(ScheduleTags::tag(12345, 3, 31), 0);
}

// TUTTI_MPI_LARGE_ALGORITHM as Open MPI's coll_libnbc_iallreduce_algorithm:
// the ring up to 8 ranks (as before issue 29), Rabenseifner above.
TEST(LogCollUnits, LargeAlgorithmRule) {
  EXPECT_EQ(libnbc_allreduce_algorithm("auto", 1), "1");
  EXPECT_EQ(libnbc_allreduce_algorithm("auto", 2), "1");
  EXPECT_EQ(libnbc_allreduce_algorithm("auto", 8), "1");
  EXPECT_EQ(libnbc_allreduce_algorithm("auto", 9), "3");
  EXPECT_EQ(libnbc_allreduce_algorithm("auto", 8192), "3");
  EXPECT_EQ(libnbc_allreduce_algorithm("ring", 8192), "1");
  EXPECT_EQ(libnbc_allreduce_algorithm("rabenseifner", 2), "3");
  EXPECT_EQ(libnbc_allreduce_algorithm("mpi", 16), "");
  const std::string e = test::expect_error(
      [] { libnbc_allreduce_algorithm("tree", 4); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.find("TUTTI_MPI_LARGE_ALGORITHM='tree'"), std::string::npos) << e;
  // tutti initialised MPI here with the variable unset: the ring (np <= 8).
  const char* set = std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
  ASSERT_NE(set, nullptr);
  EXPECT_STREQ(set, "1");
}

}  // namespace
}  // namespace mpi
}  // namespace tutti
