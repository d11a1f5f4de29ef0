// The NCCL watchdog's logic on the CPU (label comm): fake operations, a
// fake clock and fake transport hooks drive comm::Watchdog through every
// transition the GPU path relies on (tests/comm/test_nccl_watchdog.cc
// checks the same on a device).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/watchdog.h"
#include "core/check.h"

namespace tutti {
namespace comm {
namespace {

using Clock = Watchdog::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

class FakeOp : public WatchedOp {
 public:
  bool poll() override {
    ++polls;
    if (throw_mismatch)
      TUTTI_THROW(kMismatch, "allreduce #", seq, ": ranks disagree");
    return done;
  }
  std::string phase() const override { return phase_text; }
  void fail(std::exception_ptr e) override {
    if (!error) error = e;
    ++fails;
  }
  // The failure's code and message (kInternal / "" if it did not fail).
  std::pair<ErrorCode, std::string> failure() const {
    if (!error) return {ErrorCode::kInternal, ""};
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      return {e.code(), e.message()};
    }
  }

  uint64_t seq = 0;
  std::atomic<bool> done{false};
  bool throw_mismatch = false;
  std::string phase_text = "waiting for the GPU";
  std::exception_ptr error;
  int fails = 0;
  std::atomic<int> polls{0};
};

struct Harness {
  // with_peers: a Hooks::peers that answers like the status service.
  explicit Harness(bool with_peers = false) {
    Watchdog::Hooks h;
    if (with_peers)
      h.peers = [this](uint64_t seq, bool stall) {
        asked.emplace_back(seq, stall);
        return stall ? "arrived: rank 0; missing: rank 1 (last entered #" +
                           std::to_string(seq - 1) + " allreduce, finished it)"
                     : "never arrived: rank 1 (last entered #" +
                           std::to_string(seq - 1) + " allreduce, finished it)";
      };
    h.async_error = [this] { return async; };
    h.ranks_lost = [this] {
      std::lock_guard<std::mutex> lock(lost_mu);
      return lost;
    };
    h.abort = [this] { ++aborts; };
    h.on_broken = [this](const Error& e) {
      ++broken_calls;
      broken_code = e.code();
    };
    dog.reset(new Watchdog("NCCL", "world-cuda0", h));
  }
  std::shared_ptr<FakeOp> add(uint64_t seq, double timeout, Clock::time_point t0) {
    auto op = std::make_shared<FakeOp>();
    op->seq = seq;
    dog->add(op, seq, "allreduce #" + std::to_string(seq) + " 'grad'", timeout, t0);
    return op;
  }
  std::string async;
  std::mutex lost_mu;
  std::string lost;  // Hooks::ranks_lost's answer (ULFM's failure note)
  void lose(const std::string& note) {
    std::lock_guard<std::mutex> lock(lost_mu);
    lost = note;
  }
  std::vector<std::pair<uint64_t, bool>> asked;  // peers(seq, stall) calls
  int aborts = 0;
  int broken_calls = 0;
  ErrorCode broken_code = ErrorCode::kInternal;
  std::unique_ptr<Watchdog> dog;
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Watchdog, CompletedOpsLeaveInAnyOrderAndNothingBreaks) {
  Harness h;
  const auto t0 = Clock::now();
  auto a = h.add(1, 5, t0), b = h.add(2, 5, t0), c = h.add(3, 5, t0);
  EXPECT_EQ(h.dog->poll(t0 + seconds(1)), 3u);
  b->done = true;  // a later op finished first (its check completed)
  EXPECT_EQ(h.dog->poll(t0 + seconds(2)), 2u);
  a->done = c->done = true;
  EXPECT_EQ(h.dog->poll(t0 + seconds(100)), 0u);  // done ops never time out
  EXPECT_FALSE(h.dog->broken());
  EXPECT_EQ(h.aborts, 0);
  EXPECT_EQ(a->fails + b->fails + c->fails, 0);
  EXPECT_NO_THROW(h.dog->throw_if_broken("barrier #4"));
}

TEST(Watchdog, TimeoutNamesTheExpiredOpAndItsSequenceAndAbortsOnce) {
  Harness h;
  const auto t0 = Clock::now();
  auto first = h.add(7, 10, t0);
  auto second = h.add(8, 2, t0 + seconds(1));  // shorter deadline: 3 s
  first->phase_text = "agreeing on the operation";
  EXPECT_EQ(h.dog->poll(t0 + milliseconds(2999)), 2u);
  EXPECT_FALSE(h.dog->broken());
  EXPECT_EQ(h.dog->poll(t0 + seconds(3)), 0u);
  ASSERT_TRUE(h.dog->broken());
  EXPECT_EQ(h.aborts, 1);
  EXPECT_EQ(h.broken_calls, 1);
  EXPECT_EQ(h.broken_code, ErrorCode::kTimeout);
  // The op whose deadline passed carries the timeout ...
  auto f2 = second->failure();
  EXPECT_EQ(f2.first, ErrorCode::kTimeout);
  EXPECT_TRUE(has(f2.second, "allreduce #8 'grad' did not complete within 2 s (TUTTI_TIMEOUT)"))
      << f2.second;
  EXPECT_TRUE(has(f2.second, "oldest operation still in flight is allreduce #7 'grad', "
                             "agreeing on the operation")) << f2.second;
  EXPECT_TRUE(has(f2.second, "NCCL communicator 'world-cuda0' was aborted")) << f2.second;
  // ... every other op in flight is aborted naming the cause.
  auto f1 = first->failure();
  EXPECT_EQ(f1.first, ErrorCode::kAborted);
  EXPECT_TRUE(has(f1.second, "allreduce #7 'grad': aborted because the NCCL communicator "
                             "'world-cuda0' broke: allreduce #8")) << f1.second;
  // Later polls and breaks change nothing.
  EXPECT_EQ(h.dog->poll(t0 + seconds(60)), 0u);
  h.dog->break_with(Error(ErrorCode::kCommFailure, "late"), nullptr);
  EXPECT_EQ(h.aborts, 1);
  EXPECT_EQ(h.broken_calls, 1);
  EXPECT_EQ(first->fails, 1);
  EXPECT_TRUE(has(h.dog->cause(), "allreduce #8")) << h.dog->cause();
}

// The abort hook (ncclCommAbort) can block: its cudaFree waits for every
// kernel on the device, also a kernel of the user's that the timed-out op
// was ordered after (seen on an H100, 2026-11-27: synchronize() returned
// with no error 60 s later, once that kernel ended).  So the ops in flight
// fail, and the process-wide reaction runs (TUTTI_EXIT_ON_COMM_FAILURE ends
// the process there), before the abort starts.
TEST(Watchdog, OpsFailAndOnBrokenRunsBeforeTheAbortHook) {
  std::shared_ptr<FakeOp> op;
  bool failed_before_abort = false, broken_before_abort = false;
  int broken_calls = 0;
  Watchdog::Hooks hooks;
  hooks.on_broken = [&](const Error&) { ++broken_calls; };
  hooks.abort = [&] {
    failed_before_abort = op && op->error != nullptr;
    broken_before_abort = broken_calls == 1;
  };
  Watchdog dog("NCCL", "world-cuda0", hooks);
  const auto t0 = Clock::now();
  op = std::make_shared<FakeOp>();
  dog.add(op, 1, "allreduce #1 'grad'", 3, t0);
  EXPECT_EQ(dog.poll(t0 + seconds(4)), 0u);
  ASSERT_TRUE(dog.broken());
  EXPECT_TRUE(failed_before_abort) << "a waiter must see the timeout while the abort runs";
  EXPECT_TRUE(broken_before_abort) << "on_broken must not wait for the abort";
  EXPECT_EQ(op->failure().first, ErrorCode::kTimeout);
}

TEST(Watchdog, LaterOpsFailAtOnceWithTheCause) {
  Harness h;
  const auto t0 = Clock::now();
  h.add(1, 1, t0);
  h.dog->poll(t0 + seconds(2));
  ASSERT_TRUE(h.dog->broken());
  try {
    h.dog->throw_if_broken("broadcast #2 'w' float32[4] on group 'world-cuda0'");
    ADD_FAILURE() << "expected kAborted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted);
    EXPECT_TRUE(has(e.message(), "broadcast #2 'w' float32[4] on group 'world-cuda0': the NCCL "
                                 "communicator 'world-cuda0' is unusable after an earlier "
                                 "failure: allreduce #1 'grad' did not complete within 1 s"))
        << e.message();
  }
  // An op registered after the break (a race with the engine) fails too.
  auto late = h.add(3, 5, t0);
  EXPECT_EQ(late->failure().first, ErrorCode::kAborted);
  EXPECT_TRUE(has(late->failure().second, "allreduce #3 'grad': the NCCL communicator"));
  EXPECT_EQ(h.dog->in_flight(), 0u);
}

TEST(Watchdog, NoDeadlineWhenTheTimeoutIsZero) {
  Harness h;
  const auto t0 = Clock::now();
  auto op = h.add(1, 0, t0);
  EXPECT_EQ(h.dog->poll(t0 + std::chrono::hours(1000)), 1u);
  EXPECT_FALSE(h.dog->broken());
  op->done = true;
  EXPECT_EQ(h.dog->poll(), 0u);
}

TEST(Watchdog, AsyncErrorBreaksNamingTheOldestOpInFlight) {
  Harness h;
  const auto t0 = Clock::now();
  auto a = h.add(4, 100, t0), b = h.add(5, 100, t0);
  EXPECT_EQ(h.dog->poll(t0), 2u);
  h.async = "remote process exited or there was a network error";
  EXPECT_EQ(h.dog->poll(t0 + seconds(1)), 0u);
  EXPECT_EQ(h.aborts, 1);
  EXPECT_EQ(h.broken_code, ErrorCode::kCommFailure);
  auto fa = a->failure();
  EXPECT_EQ(fa.first, ErrorCode::kCommFailure);
  EXPECT_TRUE(has(fa.second, "allreduce #4 'grad': NCCL communicator 'world-cuda0' reported an "
                             "asynchronous error (remote process exited")) << fa.second;
  EXPECT_EQ(b->failure().first, ErrorCode::kAborted);
}

TEST(Watchdog, AsyncErrorWithNothingInFlightStillBreaks) {
  Harness h;
  h.async = "unhandled system error";
  EXPECT_EQ(h.dog->poll(), 0u);
  EXPECT_TRUE(h.dog->broken());
  EXPECT_TRUE(has(h.dog->cause(), "no operation in flight")) << h.dog->cause();
}

// ULFM (docs/elastic.md, "A killed process"): a dead process the MPI side
// knows of ends the device ops in flight with kRanksLost, long before
// their deadline, and aborts the transport once.
TEST(Watchdog, ADeadPeerBreaksWithRanksLostNamingTheOldestOpInFlight) {
  Harness h;
  const auto t0 = Clock::now();
  auto a = h.add(7, 100, t0), b = h.add(8, 0, t0);  // b: no deadline at all
  EXPECT_EQ(h.dog->poll(t0), 2u);
  h.lose("world rank 2 died (MPI's failure detector)");
  EXPECT_EQ(h.dog->poll(t0 + milliseconds(1)), 0u);
  EXPECT_TRUE(h.dog->broken());
  EXPECT_EQ(h.aborts, 1);
  EXPECT_EQ(h.broken_calls, 1);
  EXPECT_EQ(h.broken_code, ErrorCode::kRanksLost);
  auto fa = a->failure();
  EXPECT_EQ(fa.first, ErrorCode::kRanksLost);
  EXPECT_TRUE(has(fa.second, "allreduce #7 'grad': world rank 2 died")) << fa.second;
  EXPECT_TRUE(has(fa.second, "tutti::recover()")) << fa.second;
  auto fb = b->failure();
  EXPECT_EQ(fb.first, ErrorCode::kAborted);
  EXPECT_TRUE(has(fb.second, "world rank 2 died")) << fb.second;
  // Later submissions fail at once, naming the cause.
  auto c = h.add(9, 100, t0);
  EXPECT_EQ(c->failure().first, ErrorCode::kAborted);
  EXPECT_EQ(h.aborts, 1);
}

TEST(Watchdog, ADeadPeerWithNothingInFlightBreaksNothing) {
  // recover() abandons an idle communicator; the watchdog leaves it alone.
  Harness h;
  h.lose("world rank 1 died");
  EXPECT_EQ(h.dog->poll(), 0u);
  EXPECT_FALSE(h.dog->broken());
  EXPECT_EQ(h.aborts, 0);
}

TEST(Watchdog, ThreadEndsAnOpWithoutDeadlineOnceAPeerDied) {
  // A kernel blocked on a dead peer with TUTTI_TIMEOUT=0: the polling
  // thread alone ends it, within a few passes of the failure note.
  Harness h;
  h.dog->start_thread(std::chrono::microseconds(200));
  auto hung = h.add(3, 0, Clock::now());
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(h.dog->broken());
  const auto lost_at = Clock::now();
  h.lose("world rank 3 died");
  const auto give_up = lost_at + seconds(20);
  while (!h.dog->broken() && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(1));
  const double took = std::chrono::duration<double>(Clock::now() - lost_at).count();
  h.dog->stop_thread();
  ASSERT_TRUE(h.dog->broken());
  EXPECT_EQ(hung->failure().first, ErrorCode::kRanksLost);
  // The pause between passes is capped by TUTTI_MPI_WAIT_SLEEP_US (ms), far
  // below this bound; a count, not a timing: it only rules out "never".
  EXPECT_LT(took, 10.0);
}

TEST(Watchdog, AnOpThatReportsAMismatchBreaksWithThatError) {
  Harness h;
  const auto t0 = Clock::now();
  auto a = h.add(1, 100, t0), b = h.add(2, 100, t0);
  a->done = true;
  b->throw_mismatch = true;
  EXPECT_EQ(h.dog->poll(t0), 0u);
  EXPECT_TRUE(h.dog->broken());
  EXPECT_EQ(h.aborts, 1);  // the mismatched NCCL op may hang: abort
  auto fb = b->failure();
  EXPECT_EQ(fb.first, ErrorCode::kMismatch);
  EXPECT_TRUE(has(fb.second, "allreduce #2: ranks disagree")) << fb.second;
  EXPECT_EQ(a->fails, 0);  // it had completed
}

// The NCCL path names the missing ranks as the MPI path does: the backend's
// peers hook (the status service over MPI) is asked for the op that timed
// out or stalled, and its answer sits in the error and the warning.
TEST(Watchdog, TimeoutAndStallNameTheRanksThePeersHookReports) {
  Harness h(/*with_peers=*/true);
  h.dog->set_stall_warn_s(1.0);
  const auto t0 = Clock::now();
  auto op = h.add(5, 3, t0);
  h.dog->poll(t0 + milliseconds(1100));
  ASSERT_EQ(h.dog->stall_warnings(), 1u);
  const std::string w = h.dog->last_stall_warning();
  EXPECT_TRUE(has(w, "stall: allreduce #5 'grad' has been in flight for 1.1 s while "
                     "waiting for the GPU on the NCCL communicator 'world-cuda0'; "
                     "arrived: rank 0; missing: rank 1 (last entered #4 allreduce, "
                     "finished it) (TUTTI_STALL_WARN_S=1; fails at TUTTI_TIMEOUT=3 s)"))
      << w;
  EXPECT_EQ(h.dog->poll(t0 + seconds(3)), 0u);
  ASSERT_TRUE(h.dog->broken());
  const auto f = op->failure();
  EXPECT_EQ(f.first, ErrorCode::kTimeout);
  EXPECT_TRUE(has(f.second, "allreduce #5 'grad' did not complete within 3 s (TUTTI_TIMEOUT) "
                            "while waiting for the GPU; never arrived: rank 1 (last entered "
                            "#4 allreduce, finished it); the NCCL communicator "
                            "'world-cuda0' was aborted")) << f.second;
  EXPECT_EQ(h.asked, (std::vector<std::pair<uint64_t, bool>>{{5, true}, {5, false}}));
}

TEST(Watchdog, StallWarningsRepeatEveryPeriodUntilTheOpCompletes) {
  Harness h;
  h.dog->set_stall_warn_s(1.0);
  const auto t0 = Clock::now();
  auto slow = h.add(1, 10, t0);
  auto fast = h.add(2, 10, t0);
  fast->done = true;
  h.dog->poll(t0 + milliseconds(500));
  EXPECT_EQ(h.dog->stall_warnings(), 0u);
  h.dog->poll(t0 + milliseconds(1200));
  EXPECT_EQ(h.dog->stall_warnings(), 1u);  // the slow op only
  h.dog->poll(t0 + milliseconds(1500));
  EXPECT_EQ(h.dog->stall_warnings(), 1u);  // not again within the period
  h.dog->poll(t0 + milliseconds(3100));    // two periods later: once
  EXPECT_EQ(h.dog->stall_warnings(), 2u);
  slow->done = true;
  EXPECT_EQ(h.dog->poll(t0 + milliseconds(5000)), 0u);
  EXPECT_EQ(h.dog->stall_warnings(), 2u);
  EXPECT_FALSE(h.dog->broken());
  EXPECT_EQ(slow->fails, 0);
}

TEST(Watchdog, NoStallWarningWhenDisabled) {
  Harness h;
  h.dog->set_stall_warn_s(0);
  const auto t0 = Clock::now();
  h.add(1, 0, t0);
  h.dog->poll(t0 + seconds(100));
  EXPECT_EQ(h.dog->stall_warnings(), 0u);
}

TEST(Watchdog, ThreadPollsUntilTheDeadlineWithoutAnyWaiter) {
  // The Work::wait() path: nobody synchronises, the thread still fires.
  Harness h;
  std::atomic<bool> setup_ran{false};
  h.dog->start_thread(std::chrono::microseconds(200), [&] {
    setup_ran = true;
    return std::shared_ptr<void>();
  });
  auto done_op = h.add(1, 0.05, Clock::now());
  done_op->done = true;
  auto hung = h.add(2, 0.2, Clock::now());
  const auto give_up = Clock::now() + seconds(20);
  while (!h.dog->broken() && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(5));
  h.dog->stop_thread();
  EXPECT_TRUE(setup_ran);
  ASSERT_TRUE(h.dog->broken());
  EXPECT_EQ(done_op->fails, 0);
  EXPECT_EQ(hung->failure().first, ErrorCode::kTimeout);
  EXPECT_TRUE(has(hung->failure().second, "allreduce #2 'grad' did not complete within 0.2 s"));
}

TEST(Watchdog, IdleThreadDoesNotPoll) {
  Harness h;
  h.dog->start_thread(std::chrono::microseconds(100));
  auto op = h.add(1, 100, Clock::now());
  op->done = true;
  const auto give_up = Clock::now() + seconds(20);
  while (h.dog->in_flight() && Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(1));
  const int polls = op->polls;
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(op->polls, polls);
  h.dog->stop_thread();
  h.dog->stop_thread();  // idempotent
}

}  // namespace
}  // namespace comm
}  // namespace tutti
