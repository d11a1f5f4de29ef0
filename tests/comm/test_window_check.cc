// The NCCL path's windowed agreement check (src/comm/op_window.h,
// src/comm/mpi/window_check.h) over MPI, without a GPU: fake operation
// descriptors go through the same OpWindow + WindowCheck the NCCL
// communicator uses, at 1-8 ranks.
//  * window boundaries in closed form (1, 2, 4, ... then every K);
//  * agreeing windows: phase 1 only, ceil(log2 W)-round messages per
//    window (closed form), nothing for the operations inside a window;
//  * a difference anywhere in a window (one rank's count, a skipped
//    operation, a rejected one, another number of checked operations)
//    raises the same kMismatch on every rank, naming the first operation
//    that differed and the rank, at the window that holds it; the windows
//    before it agree;
//  * several windows in flight, tested in a rank-dependent order.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "comm/counters.h"
#include "comm/mpi/log_coll.h"
#include "comm/mpi/window_check.h"
#include "comm/op_window.h"
#include "tutti/error.h"

namespace tutti {
namespace mpi {
namespace {

using comm::counters::Protocol;

comm::WireDesc op(uint64_t seq, int64_t count) {
  comm::WireDesc w;
  w.seq = seq;
  w.count = count;
  w.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
  w.dtype = static_cast<uint8_t>(DType::kFloat32);
  w.op = static_cast<uint8_t>(ReduceOp::kSum);
  return w;
}

// Operation #seq's element count in the common program.
int64_t count_of(uint64_t seq) { return static_cast<int64_t>(100 + seq % 7); }

TEST(OpWindowUnits, WindowEndsRampThenEveryK) {
  // K = 64: 1, 2, 4, ..., 64, 128, 192, ...
  const uint64_t ends64[] = {1, 2, 4, 8, 16, 32, 64, 128, 192, 256};
  uint64_t prev = 0;
  for (uint64_t end : ends64) {
    for (uint64_t s = prev + 1; s <= end; ++s) EXPECT_EQ(comm::OpWindow::window_end(s, 64), end) << s;
    prev = end;
  }
  // K = 1: every operation closes its own window.
  for (uint64_t s = 1; s < 50; ++s) EXPECT_EQ(comm::OpWindow::window_end(s, 1), s);
  // K = 6 (not a power of two): sizes 1, 1, 2, 4, 6, 6: ends 1, 2, 4, 8, 14, 20.
  const uint64_t ends6[] = {1, 2, 4, 8, 14, 20, 26};
  prev = 0;
  for (uint64_t end : ends6) {
    for (uint64_t s = prev + 1; s <= end; ++s) EXPECT_EQ(comm::OpWindow::window_end(s, 6), end) << s;
    prev = end;
  }
  EXPECT_THROW(comm::OpWindow(0), Error);
}

TEST(OpWindowUnits, AddClosesAtTheEndsAndHandsOverTheWindow) {
  comm::OpWindow w(8);
  comm::OpWindowRecord rec;
  std::vector<uint64_t> closes;
  for (uint64_t s = 1; s <= 40; ++s) {
    if (w.add(s, op(s, count_of(s)), false, &rec)) {
      closes.push_back(s);
      EXPECT_EQ(rec.last_seq, s);
      EXPECT_EQ(rec.words.size(), rec.last_seq - rec.first_seq + 1);
      ASSERT_EQ(rec.wires.size(), rec.words.size());
      EXPECT_EQ(rec.wires.front().seq, rec.first_seq);
      EXPECT_TRUE(rec.invalid.empty());
      EXPECT_EQ(w.open_ops(), 0u);
    }
  }
  EXPECT_EQ(closes, (std::vector<uint64_t>{1, 2, 4, 8, 16, 24, 32, 40}));
  // A gap (an operation not checked on any rank) closes at the next one.
  comm::OpWindow g(4);
  EXPECT_TRUE(g.add(1, op(1, 1), false, &rec));
  EXPECT_TRUE(g.add(2, op(2, 1), false, &rec));
  EXPECT_FALSE(g.add(3, op(3, 1), false, &rec));
  EXPECT_EQ(g.open_ops(), 1u);
  EXPECT_EQ(g.open_first(), 3u);
  EXPECT_EQ(g.open_end(), 4u);
  EXPECT_TRUE(g.add(5, op(5, 1), true, &rec));  // #4 was not checked
  EXPECT_EQ(rec.first_seq, 3u);
  EXPECT_EQ(rec.last_seq, 5u);
  EXPECT_EQ(rec.invalid, (std::vector<uint32_t>{1}));
  // Equal windows hash equally; any word changes it.
  comm::OpWindow a(4), b(4);
  comm::OpWindowRecord ra, rb;
  for (uint64_t s = 1; s <= 4; ++s) {
    a.add(s, op(s, 10), false, &ra);
    b.add(s, op(s, s == 3 ? 11 : 10), false, &rb);
  }
  EXPECT_NE(ra.hash(), rb.hash());
  comm::OpWindowRecord rc = ra;
  EXPECT_EQ(rc.hash(), ra.hash());
}

class WindowCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (MPI_Comm* c : {&check, &detail}) {
      MPI_Comm_dup(MPI_COMM_WORLD, c);
      MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(check, &rank);
    MPI_Comm_size(check, &size);
  }
  void TearDown() override {
    MPI_Comm_free(&check);
    MPI_Comm_free(&detail);
  }

  struct Result {
    uint64_t closed_at = 0;  // the closing seq of the window that failed
    std::string error;       // its message, empty when every window agreed
    int64_t first_diff = -1;
    int windows = 0;
  };
  // Runs `n` operations through OpWindow(every) + WindowCheck, this rank's
  // descriptor of operation s from desc(s) (nullopt: not checked; the bool:
  // rejected locally), posting every window first and testing them in a
  // rank-dependent order (as the watchdog and waiters may).
  template <class Desc>
  Result run(int every, uint64_t n, Desc desc) {
    comm::OpWindow window(every);
    std::vector<std::unique_ptr<WindowCheck>> checks;
    comm::OpWindowRecord rec;
    for (uint64_t s = 1; s <= n; ++s) {
      bool invalid = false;
      comm::WireDesc w;
      if (!desc(s, &w, &invalid)) continue;
      if (window.add(s, w, invalid, &rec))
        checks.emplace_back(new WindowCheck(check, detail, std::move(rec), "no rank ran it"));
    }
    Result out;
    out.windows = static_cast<int>(checks.size());
    std::vector<size_t> order(checks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (rank % 2) std::reverse(order.begin(), order.end());
    // Settle all; remember the earliest window that failed.
    std::vector<std::string> errors(checks.size());
    std::vector<bool> done(checks.size(), false);
    for (long spin = 0;; ++spin) {
      bool all = true;
      for (size_t i : order) {
        if (done[i]) continue;
        try {
          done[i] = checks[i]->test(comm::OpLabel(std::string("window #") +
                                                  std::to_string(checks[i]->last_seq())));
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
          errors[i] = e.what();
          done[i] = true;
        }
        all = all && done[i];
      }
      if (all) break;
      EXPECT_LT(spin, 200000000L) << "window checks did not settle";
      if (spin >= 200000000L) break;
    }
    for (size_t i = 0; i < checks.size(); ++i) {
      if (!errors[i].empty() || (checks[i]->first_difference() >= 0 && out.error.empty())) {
        out.closed_at = checks[i]->last_seq();
        out.error = errors[i];
        out.first_diff = checks[i]->first_difference();
        break;
      }
    }
    return out;
  }
  // ceil(log2 W)-round recursive doubling: messages this rank sends.
  int rd_messages() const {
    if (size == 1) return 0;
    int pof2 = 1;
    while (pof2 * 2 <= size) pof2 *= 2;
    const int extra = size - pof2, log = ceil_log2(pof2);
    if (rank < 2 * extra) return rank % 2 ? log + 1 : 1;
    return log;
  }

  MPI_Comm check = MPI_COMM_NULL, detail = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

TEST_F(WindowCheckTest, AgreeingWindowsCostOneExchangePerWindow) {
  for (int every : {1, 16, 64}) {
    SCOPED_TRACE(every);
    comm::counters::reset();
    const uint64_t n = 300;
    const Result r = run(every, n, [](uint64_t s, comm::WireDesc* w, bool*) {
      *w = op(s, count_of(s));
      return true;
    });
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.first_diff, -1);
    // Windows: one per close (closed form from window_end).
    int windows = 0;
    for (uint64_t s = 1; s <= n; s = comm::OpWindow::window_end(s, every) + 1) {
      if (comm::OpWindow::window_end(s, every) <= n) ++windows;
    }
    EXPECT_EQ(r.windows, windows);
    const auto c = comm::counters::get(Protocol::kCheck);
    EXPECT_EQ(c.messages, static_cast<uint64_t>(windows * rd_messages()));
    EXPECT_EQ(c.bytes, static_cast<uint64_t>(windows * rd_messages() * 16));
    EXPECT_EQ(comm::counters::get(Protocol::kCheckDetail).messages, 0u);
    if (every == 64) EXPECT_EQ(windows, 10);  // 1, 2, 4, ..., 64, 128, 192, 256
  }
}

TEST_F(WindowCheckTest, ADifferentCountOnOneRankIsNamedAtItsOperation) {
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  const int culprit = size - 1;
  for (uint64_t bad : {uint64_t{1}, uint64_t{3}, uint64_t{37}, uint64_t{64}, uint64_t{100}}) {
    SCOPED_TRACE(bad);
    const Result r = run(64, 200, [&](uint64_t s, comm::WireDesc* w, bool*) {
      *w = op(s, count_of(s) + (rank == culprit && s == bad ? 1 : 0));
      return true;
    });
    EXPECT_EQ(r.closed_at, comm::OpWindow::window_end(bad, 64));
    const std::string want_op = "#" + std::to_string(bad);
    EXPECT_NE(r.error.find("ranks disagree on operation " + want_op), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("rank " + std::to_string(culprit)), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("x" + std::to_string(count_of(bad) + 1)), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("x" + std::to_string(count_of(bad))), std::string::npos) << r.error;
    if (bad > 2) EXPECT_NE(r.error.find("TUTTI_NCCL_CHECK_EVERY"), std::string::npos) << r.error;
  }
}

TEST_F(WindowCheckTest, ASkippedOperationDiffersAtTheFirstOneSkipped) {
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 0 skips operation 45 of the program: its #45 is the program's 46th.
  const Result r = run(16, 120, [&](uint64_t s, comm::WireDesc* w, bool*) {
    const uint64_t program = rank == 0 && s >= 45 ? s + 1 : s;
    *w = op(s, count_of(program));
    return true;
  });
  EXPECT_EQ(r.closed_at, 48u);  // windows 33-48 (K = 16)
  EXPECT_EQ(r.first_diff, 45 - 33);
  EXPECT_NE(r.error.find("operation #45 (the first that differed among #33-#48"), std::string::npos)
      << r.error;
}

TEST_F(WindowCheckTest, ARejectedClosingOperationIsNamedOnThePeers) {
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  // As the NCCL communicator does: a rank that rejects an op posts the check
  // only when that op closes its window (#8 here; inside a window it breaks
  // its communicator at once and posts nothing), then stops issuing ops.
  // (The peers' later windows would wait for it: the run ends at #8.)
  const int culprit = 1;
  const Result r = run(8, 8, [&](uint64_t s, comm::WireDesc* w, bool* invalid) {
    *w = op(s, count_of(s));
    *invalid = rank == culprit && s == 8;
    return true;
  });
  EXPECT_EQ(r.closed_at, 8u);
  EXPECT_EQ(r.first_diff, 8 - 5);
  if (rank == culprit) {
    EXPECT_EQ(r.error, "");  // its own error is the precise one
    EXPECT_EQ(r.windows, 4);  // 1, 2, 3-4, 5-8
  } else {
    EXPECT_NE(r.error.find("rank 1 rejected the arguments of allreduce #8"), std::string::npos)
        << r.error;
  }
}

TEST_F(WindowCheckTest, AnotherSetOfCheckedOperationsIsAMismatchNotAMisreadFrame) {
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  // The last rank does not check operation #10 (TUTTI_CHECK_COLLECTIVES
  // differing): its window 9-16 holds 7 operations, the others' 8.
  const Result r = run(8, 16, [&](uint64_t s, comm::WireDesc* w, bool*) {
    *w = op(s, count_of(s));
    return !(rank == size - 1 && s == 10);
  });
  EXPECT_EQ(r.closed_at, 16u);
  EXPECT_NE(r.error.find("checked different numbers of operations"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("checked 7 operations"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("checked 8 operations"), std::string::npos) << r.error;
}

TEST_F(WindowCheckTest, PerOperationWindowsMatchThePerOpCheck) {
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  // every = 1: the window is the operation itself, no range in the text.
  const Result r = run(1, 10, [&](uint64_t s, comm::WireDesc* w, bool*) {
    *w = op(s, count_of(s) + (rank == 0 && s == 7 ? 5 : 0));
    return true;
  });
  EXPECT_EQ(r.closed_at, 7u);
  EXPECT_EQ(r.first_diff, 0);
  EXPECT_NE(r.error.find("ranks disagree on operation #7: "), std::string::npos) << r.error;
}

}  // namespace
}  // namespace mpi
}  // namespace tutti
