// CPU units of the comm layer's plumbing (label comm, one rank):
//  * ProgressEngine::run_and_wait, the one "run on the engine and wait"
//    that splits (MPI and NCCL) and the NCCL bootstrap use: it runs after
//    the work queued before it and rethrows what its function threw;
//  * the checked-call macros: every MPI and NCCL call's failure becomes a
//    tutti::Error naming the rank, the context (op, group, peer) and the
//    call, and the non-throwing forms log and report instead;
//  * what the NCCL communicator refuses of a send/recv (tags, itself) and
//    a stopped ProgressEngine refusing to queue;
//  * comm::Backoff, the one waiting policy of the MPI waits and the NCCL
//    host polls (issue 15: the NCCL side yielded without ever sleeping),
//    on a fake clock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/backoff.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/progress_engine.h"
#include "core/check.h"
#include "tutti/config.h"
#if TUTTI_WITH_NCCL
#include "comm/nccl/nccl_utils.h"
#endif

namespace tutti {
namespace {

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos)
      << "'" << part << "' not in: " << s;
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
        while (!release)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
  engine.submit(
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); }, false);
  try {
    engine.run_and_wait(
        [] { TUTTI_THROW(kMismatch, "split #4: ranks disagree"); });
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
  EXPECT_EQ(
      detail::call_failed("MPI_Iallreduce(s, o, n, dt, op, data_, &req)",
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
    EXPECT_EQ(e.message(), detail::rank_prefix() +
                               "recv #2 from 1 tag 0 on group 'world' "
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

// What the NCCL communicator refuses of a send/recv before enqueueing it
// (its execute() runs this check): a tag, which NCCL would not match on
// (tagged messages posted in different orders would be swapped silently),
// and this rank as the peer (it would wait forever on one stream).
TEST(NcclCheckP2p, RefusesTagsAndSelfWithTheReason) {
  float x[4] = {};
  OpRequest r;
  r.input = r.output = Tensor(x, DType::kFloat32, Shape{4});
  const std::string desc = "send #3 'g' float32[4]";
  // check_p2p(r) must raise kInvalidArgument with every part in its text.
  auto expect_refused = [&](const char* what, std::initializer_list<std::string> parts) {
    try {
      nccl::check_p2p(r, 0, desc);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      for (const std::string& part : parts) expect_contains(e.message(), part);
    }
  };
  for (CollectiveKind kind : {CollectiveKind::kSend, CollectiveKind::kRecv}) {
    r.kind = kind;
    r.root = 1;
    r.tag = 0;
    EXPECT_NO_THROW(nccl::check_p2p(r, 0, desc)) << "tag 0 to another rank is fine";
    r.tag = 3;
    expect_refused("tag 3", {desc + ": tag 3 on an NCCL communicator",
                             "use host tensors (the MPI backend)"});
    r.tag = 0;
    r.root = 0;
    expect_refused("a message to this rank itself",
                   {"this rank itself (0) on an NCCL communicator would wait forever"});
  }
  r.kind = CollectiveKind::kAllreduce;  // collectives: not its business
  r.tag = 7;
  r.root = 0;
  EXPECT_NO_THROW(nccl::check_p2p(r, 0, desc));
}
#endif

// A stopped engine has no thread: a task it would queue would never run,
// and the Work waiting for it would wait forever (a submit racing close()).
// It refuses such a task; a blocking one on an idle engine still runs on
// the caller's thread, as before.
TEST(ProgressEngine, RefusesToQueueAfterStop) {
  comm::ProgressEngine engine("units");
  int ran = 0;
  engine.submit([&] { ++ran; }, false);
  engine.stop();
  EXPECT_EQ(ran, 1);
  try {
    engine.submit([&] { ++ran; }, false);
    ADD_FAILURE() << "a task was queued on a stopped engine";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted);
    expect_contains(e.message(), "communicator 'units' is closed");
  }
  engine.submit([&] { ++ran; }, true);
  EXPECT_EQ(ran, 2);
}

using comm::Backoff;
using us = std::chrono::microseconds;

// Steps of a wait that never completes, the clock advancing `tick` per poll.
std::vector<Backoff::Step> steps(int64_t cap_us, us tick, int n) {
  Backoff b(cap_us);
  auto now = Backoff::Clock::time_point{} + std::chrono::seconds(1);
  std::vector<Backoff::Step> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(b.next(now));
    now += tick + us(out.back().sleep_us);
  }
  return out;
}

TEST(Backoff, SpinsThenYieldsThenSleepsDoublingToTheCap) {
  // 1 us per poll: 64 spins, 200 yields (until 200 us passed), then sleeps.
  const auto s = steps(1000, us(1), 64 + 200 + 10);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(s[i].kind, Backoff::Kind::kSpin) << i;
    EXPECT_FALSE(s[i].check_clock) << i;
  }
  int checks = 0;
  for (int i = 64; i < 264; ++i) {
    ASSERT_EQ(s[i].kind, Backoff::Kind::kYield) << i;
    checks += s[i].check_clock;
  }
  EXPECT_EQ(checks, 200 / 64);  // every 64th yield looks at the clock
  const int64_t want[] = {20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000};
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(s[264 + k].kind, Backoff::Kind::kSleep) << k;
    EXPECT_EQ(s[264 + k].sleep_us, want[k]) << k;
    EXPECT_TRUE(s[264 + k].check_clock) << k;
  }
}

TEST(Backoff, CapZeroYieldsForever) {
  const auto s = steps(0, us(50), 64 + 1000);
  for (size_t i = 64; i < s.size(); ++i)
    ASSERT_EQ(s[i].kind, Backoff::Kind::kYield) << i;
}

TEST(Backoff, CapBelowTheFirstSleepIsTheSleep) {
  const auto s = steps(5, us(100), 64 + 3 + 3);
  // 100 us per poll: two yields see < 200 us, the rest sleep 5 us.
  EXPECT_EQ(s[64].kind, Backoff::Kind::kYield);
  EXPECT_EQ(s[65].kind, Backoff::Kind::kYield);
  for (int i = 66; i < 70; ++i) {
    EXPECT_EQ(s[i].kind, Backoff::Kind::kSleep) << i;
    EXPECT_EQ(s[i].sleep_us, 5) << i;
  }
}

TEST(Backoff, CapFollowsTheSettingAfterReload) {
  setenv("TUTTI_MPI_WAIT_SLEEP_US", "250", 1);
  config::reload();
  EXPECT_EQ(comm::wait_sleep_cap_us(), 250);
  unsetenv("TUTTI_MPI_WAIT_SLEEP_US");
  config::reload();
  EXPECT_EQ(comm::wait_sleep_cap_us(), 1000);
}

TEST(Backoff, SpinsAndYieldFollowTheSettings) {
  setenv("TUTTI_MPI_WAIT_SPINS", "16", 1);
  setenv("TUTTI_MPI_WAIT_YIELD_US", "30", 1);
  config::reload();
  Backoff b = Backoff::from_settings();
  auto now = Backoff::Clock::time_point{} + std::chrono::seconds(1);
  std::vector<Backoff::Step> s;
  for (int i = 0; i < 16 + 30 + 2; ++i) {  // 1 us per poll
    s.push_back(b.next(now));
    now += us(1) + us(s.back().sleep_us);
  }
  for (int i = 0; i < 16; ++i) EXPECT_EQ(s[i].kind, Backoff::Kind::kSpin) << i;
  for (int i = 16; i < 16 + 30; ++i) EXPECT_EQ(s[i].kind, Backoff::Kind::kYield) << i;
  EXPECT_EQ(s[16 + 30].kind, Backoff::Kind::kSleep);
  EXPECT_EQ(s[16 + 30].sleep_us, 20);
  unsetenv("TUTTI_MPI_WAIT_SPINS");
  unsetenv("TUTTI_MPI_WAIT_YIELD_US");
  config::reload();
  // Back to the defaults: 64 spins.
  Backoff d = Backoff::from_settings();
  for (int i = 0; i < Backoff::kSpinPolls; ++i)
    ASSERT_EQ(d.next(now).kind, Backoff::Kind::kSpin) << i;
  EXPECT_EQ(d.next(now).kind, Backoff::Kind::kYield);
}

// The yield phase's default depends on whether the machine runs more ranks
// than it has cores; an explicit setting wins either way.
int yields_before_sleep() {
  Backoff b = Backoff::from_settings();
  auto now = Backoff::Clock::time_point{} + std::chrono::seconds(1);
  int yields = 0;
  for (int i = 0; i < 100000; ++i) {  // 1 us per poll
    const Backoff::Step s = b.next(now);
    if (s.kind == Backoff::Kind::kSleep) return yields;
    if (s.kind == Backoff::Kind::kYield) ++yields;
    now += us(1);
  }
  return -1;
}

TEST(Backoff, YieldsLongerWhenRanksOutnumberCores) {
  const bool was = comm::oversubscribed();
  comm::set_oversubscribed(false);
  EXPECT_EQ(yields_before_sleep(), Backoff::kYieldUs);
  comm::set_oversubscribed(true);
  EXPECT_EQ(yields_before_sleep(), Backoff::kOversubscribedYieldUs);
  EXPECT_GT(Backoff::kOversubscribedYieldUs, Backoff::kYieldUs);
  setenv("TUTTI_MPI_WAIT_YIELD_US", "30", 1);
  config::reload();
  EXPECT_EQ(yields_before_sleep(), 30) << "an explicit setting wins";
  comm::set_oversubscribed(false);
  EXPECT_EQ(yields_before_sleep(), 30);
  setenv("TUTTI_MPI_WAIT_YIELD_US", "-1", 1);
  config::reload();
  EXPECT_EQ(yields_before_sleep(), Backoff::kYieldUs) << "-1 is the default";
  unsetenv("TUTTI_MPI_WAIT_YIELD_US");
  config::reload();
  comm::set_oversubscribed(was);
}

// A real wait of 30 ms under the policy sleeps for most of it: few polls
// (a yielding wait polls tens of thousands of times).
TEST(Backoff, LongWaitPollsRarely) {
  Backoff b(1000);
  const auto end = Backoff::Clock::now() + std::chrono::milliseconds(30);
  int polls = 0;
  while (Backoff::Clock::now() < end) {
    ++polls;
    b.next_and_pause();
  }
  EXPECT_LT(polls, 64 + 2000 + 60) << "the wait did not back off to sleeps";
}

}  // namespace
}  // namespace tutti
