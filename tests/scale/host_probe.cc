// Scale probe for tutti's small host ops (issue 29, WP1; tests/scale/host.cmake).
//
// At W ranks, per op and rank, from tutti's own counters (comm/counters.h):
//  * a check-only op: the agreement check of an all-reduce above
//    TUTTI_MPI_FOLD_BYTES (a 16-byte header through recursive doubling; the
//    data then goes to MPI, one call);
//  * a barrier and a 1 KiB all-reduce, folded into the check's frame: one
//    exchange of 16 + payload bytes and no MPI collective.
// Closed forms (log_coll.h, RdAllreduce), p the largest power of two <= W:
// max over ranks of messages = log2(p) + (W > p ? 1 : 0) and of rounds =
// log2(p) + (W > p ? 2 : 0), so both stay <= 1 + ceil(log2 W) and
// 2 + ceil(log2 W) (a + b*ceil(log2 W) with b = 1); bytes = messages x the
// frame.  Before issue 29 the check alone was a libnbc ring all-reduce:
// 2(W-1) messages per rank, which this bound rejects from W = 4 on.
// Rank 0 prints one JSON line per op for the record.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "comm/counters.h"
#include "comm/mpi/log_coll.h"
#include "tutti/config.h"
#include "tutti/tutti.h"

namespace tutti {
namespace {

namespace counters = comm::counters;
using counters::Protocol;

constexpr int kReps = 20;

struct PerOp {
  uint64_t messages = 0, bytes = 0, rounds = 0, calls = 0;
};

// The per-op counts of `p` over kReps runs of `op`, maximum over ranks.
PerOp measure(Protocol p, const std::function<void()>& op) {
  const counters::Counts before = counters::get(p);
  for (int i = 0; i < kReps; ++i) op();
  const counters::Counts after = counters::get(p);
  uint64_t v[4] = {after.messages - before.messages, after.bytes - before.bytes,
                   after.rounds - before.rounds, after.calls - before.calls};
  // Raw MPI on the world: not one of tutti's counted protocols.
  MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  PerOp r;
  r.messages = v[0];
  r.bytes = v[1];
  r.rounds = v[2];
  r.calls = v[3];
  return r;
}

class ScaleHostOps : public ::testing::Test {
 protected:
  void SetUp() override {
    while (pof2 * 2 <= size) pof2 *= 2;
    log_w = mpi::ceil_log2(size);
    log_p = mpi::ceil_log2(pof2);
  }
  // Asserts the closed forms for ops whose frame is `frame` bytes.
  void expect_log(const char* what, const PerOp& m, uint64_t frame) {
    const uint64_t msgs = static_cast<uint64_t>(log_p + (size > pof2 ? 1 : 0));
    const uint64_t rounds = static_cast<uint64_t>(log_p + (size > pof2 ? 2 : 0));
    EXPECT_EQ(m.calls, static_cast<uint64_t>(kReps)) << what << ": one schedule per op";
    EXPECT_EQ(m.messages, kReps * msgs) << what << ": messages per op and rank";
    EXPECT_EQ(m.rounds, kReps * rounds) << what << ": rounds per op and rank";
    EXPECT_EQ(m.bytes, kReps * msgs * frame) << what << ": bytes per op and rank";
    // The bound class the scale harness asserts: a + b*ceil(log2 W), b = 1.
    EXPECT_LE(m.messages, static_cast<uint64_t>(kReps * (1 + log_w))) << what;
    EXPECT_LE(m.rounds, static_cast<uint64_t>(kReps * (2 + log_w))) << what;
    if (size >= 4)  // what the libnbc ring cost: 2(W-1) per rank
      EXPECT_LT(m.messages, static_cast<uint64_t>(kReps * 2 * (size - 1))) << what;
    if (w->rank() == 0)
      std::printf("{\"np\": %d, \"op\": \"%s\", \"messages\": %.2f, \"bytes\": %.1f, "
                  "\"rounds\": %.2f}\n",
                  size, what, static_cast<double>(m.messages) / kReps,
                  static_cast<double>(m.bytes) / kReps,
                  static_cast<double>(m.rounds) / kReps);
  }
  ProcessGroupPtr w = world();
  int size = w->size();
  int pof2 = 1;
  int log_w = 0;
  int log_p = 0;
};

TEST_F(ScaleHostOps, LargeAllreducesUseALogRoundAlgorithmAboveEightRanks) {
  // TUTTI_MPI_LARGE_ALGORITHM=auto, set before MPI_Init (the test leaves the
  // variable unset): libnbc's ring (1) up to 8 ranks, Rabenseifner (3) above.
  const char* set = std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
  ASSERT_NE(set, nullptr);
  EXPECT_STREQ(set, size <= 8 ? "1" : "3");
}

TEST_F(ScaleHostOps, CheckOnlyOpIsLogarithmic) {
  const size_t limit = static_cast<size_t>(config::get_int("TUTTI_MPI_FOLD_BYTES"));
  std::vector<float> big(limit / 4 + 1, 1.0f);
  const uint64_t mpi_before = counters::get(Protocol::kMpiCollective).calls;
  const PerOp m = measure(Protocol::kCheck, [&] { w->allreduce(Tensor::of(big)); });
  expect_log("check", m, 16);
  EXPECT_EQ(counters::get(Protocol::kMpiCollective).calls - mpi_before,
            static_cast<uint64_t>(kReps)) << "the data goes to MPI";
}

TEST_F(ScaleHostOps, BarrierIsTheCheckAlone) {
  const PerOp m = measure(Protocol::kFold, [&] { w->barrier(); });
  expect_log("barrier", m, 16);
}

TEST_F(ScaleHostOps, OneKibAllreduceFoldsIntoTheCheck) {
  std::vector<float> v(256), out(256);
  for (int i = 0; i < 256; ++i) v[i] = static_cast<float>(i + w->rank());
  const uint64_t mpi_before = counters::get(Protocol::kMpiCollective).calls;
  const PerOp m = measure(Protocol::kFold, [&] {
    w->allreduce(Tensor::of(v), Tensor::of(out), ReduceOp::kSum);
  });
  expect_log("allreduce_1KiB", m, 16 + 1024);
  EXPECT_EQ(counters::get(Protocol::kMpiCollective).calls, mpi_before);
  const float ranks = static_cast<float>(size * (size - 1) / 2);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(out[i], ranks + size * i) << i;
}

}  // namespace
}  // namespace tutti
