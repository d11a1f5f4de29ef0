// CPU units of the comm layer's plumbing (label comm, one rank):
//  * ProgressEngine::run_and_wait, the one "run on the engine and wait"
//    that splits (MPI and NCCL) and the NCCL bootstrap use: it runs after
//    the work queued before it and rethrows what its function threw;
//  * the checked-call macros: every MPI and NCCL call's failure becomes a
//    tutti::Error naming the rank, the context (op, group, peer) and the
//    call, and the non-throwing forms log and report instead.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/progress_engine.h"
#include "core/check.h"
#if TUTTI_WITH_NCCL
#include "comm/nccl/nccl_utils.h"
#endif

namespace tutti {
namespace {

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "'" << part << "' not in: " << s;
}

TEST(RunAndWait, RunsAfterTheWorkQueuedBeforeIt) {
  comm::ProgressEngine engine("units");
  std::mutex mu;
  std::vector<int> order;
  std::atomic<bool> release{false};
  // An async task holds the engine until released: run_and_wait's function
  // must queue behind it, not run on the caller's thread at once.
  engine.submit(
      [&] {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(1);
      },
      false);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(0);
    }
    release = true;
  });
  std::thread::id ran_on;
  engine.run_and_wait([&] {
    ran_on = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(2);
  });
  // Returned only once its function ran, after the queued task.
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  }
  EXPECT_NE(ran_on, std::this_thread::get_id()) << "ran on the engine's thread";
  releaser.join();
}

TEST(RunAndWait, IdleEngineRunsItAtOnce) {
  comm::ProgressEngine engine("units");
  int ran = 0;
  engine.run_and_wait([&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(RunAndWait, RethrowsWhatTheFunctionThrew) {
  comm::ProgressEngine engine("units");
  engine.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); },
                false);
  try {
    engine.run_and_wait([] { TUTTI_THROW(kMismatch, "split #4: ranks disagree"); });
    ADD_FAILURE() << "nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch);
    expect_contains(e.message(), "split #4: ranks disagree");
  }
  // The engine still runs later work.
  int ran = 0;
  engine.run_and_wait([&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(CallFailed, NamesContextCallAndText) {
  EXPECT_EQ(detail::call_failed("MPI_Iallreduce(s, o, n, dt, op, data_, &req)",
                                "allreduce #3 on group 'world'", "MPI_ERR_COMM"),
            "allreduce #3 on group 'world': MPI_Iallreduce failed: MPI_ERR_COMM");
  EXPECT_EQ(detail::call_failed("ncclCommCount (out, &n)", "", "invalid usage"),
            "ncclCommCount failed: invalid usage");
}

// Stand-ins for a failing and a succeeding library call.
int failing_mpi_call(int) { return MPI_ERR_TRUNCATE; }
int succeeding_mpi_call(int) { return MPI_SUCCESS; }

TEST(MpiCheck, ThrowsKMpiWithRankContextAndMpiText) {
  const comm::OpLabel desc("recv #2 from 1 tag 0 on group 'world'");
  try {
    TUTTI_MPI_CHECK(failing_mpi_call(3), desc, " (posting it)");
    ADD_FAILURE() << "nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMpi);
    EXPECT_EQ(e.message(),
              detail::rank_prefix() + "recv #2 from 1 tag 0 on group 'world' "
              "(posting it): failing_mpi_call failed: " +
                  mpi::error_string(MPI_ERR_TRUNCATE));
    expect_contains(e.message(), "rank 0: ");
  }
  EXPECT_NO_THROW(TUTTI_MPI_CHECK(succeeding_mpi_call(1), desc));
}

TEST(MpiCheck, WarnFormReportsInsteadOfThrowing) {
  bool ok = true;
  EXPECT_NO_THROW(ok = TUTTI_MPI_WARN(failing_mpi_call(0), "closing 'g'"));
  EXPECT_FALSE(ok);
  EXPECT_TRUE(TUTTI_MPI_WARN(succeeding_mpi_call(0), "closing 'g'"));
}

#if TUTTI_WITH_NCCL
ncclResult_t failing_nccl_call(int) { return ncclInvalidUsage; }

TEST(NcclCheck, ThrowsKNcclWithContextAndNcclText) {
  try {
    TUTTI_NCCL_CHECK(failing_nccl_call(0), "NCCL communicator 'world-cuda0'");
    ADD_FAILURE() << "nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNccl);
    expect_contains(e.message(), detail::rank_prefix() +
                                     "NCCL communicator 'world-cuda0': "
                                     "failing_nccl_call failed: " +
                                     ncclGetErrorString(ncclInvalidUsage));
  }
  bool ok = true;
  EXPECT_NO_THROW(ok = TUTTI_NCCL_WARN(failing_nccl_call(0), "closing"));
  EXPECT_FALSE(ok);
}
#endif

}  // namespace
}  // namespace tutti
