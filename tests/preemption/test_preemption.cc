// PreemptionMonitor: signals, the trigger file, manual notices, the
// collective stop decision, and configuration errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "common/test_util.h"
#include "tutti/preemption.h"

namespace tutti {
namespace {

PreemptionOptions only(const std::string& sources) {
  PreemptionOptions o;
  o.sources = sources;
  o.poll_ms = 20;
  return o;
}

TEST(Preemption, ASignalOnOneRankStopsEveryRankAtTheSameCall) {
  auto w = world();
  PreemptionMonitor m(only("signals"));
  EXPECT_FALSE(m.should_stop(*w));
  EXPECT_EQ(m.local(), NoticeKind::kNone);
  const int victim = w->size() - 1;
  if (w->rank() == victim) raise(SIGUSR2);
  EXPECT_TRUE(m.should_stop(*w)) << "every rank must agree at the same call";
  if (w->rank() == victim) {
    ASSERT_TRUE(m.notice().has_value());
    EXPECT_EQ(m.notice()->source, "SIGUSR2");
    EXPECT_EQ(m.local(), NoticeKind::kStop);
  } else {
    EXPECT_EQ(m.local(), NoticeKind::kNone) << "others learn it only through agreement";
  }
  EXPECT_TRUE(m.should_stop(*w)) << "a notice stays raised";
}

TEST(Preemption, SigtermAndSigusr1AreNoticesToo) {
  for (int sig : {SIGTERM, SIGUSR1}) {
    PreemptionMonitor m(only("signals"));
    raise(sig);  // would end the process without the handler
    EXPECT_EQ(m.local(), NoticeKind::kStop);
  }
}

TEST(Preemption, HandlersAreRestoredAndOwnedByOneMonitor) {
  struct sigaction before {}, during {}, after {};
  sigaction(SIGUSR1, nullptr, &before);
  {
    PreemptionMonitor m(only("signals"));
    sigaction(SIGUSR1, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler);
    EXPECT_THROW(PreemptionMonitor second(only("signals")), Error);
    PreemptionMonitor no_signals(only("none"));  // fine alongside
    EXPECT_TRUE(no_signals.sources().empty());
  }
  sigaction(SIGUSR1, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(Preemption, RebalanceIsAgreedButStopsOnlyWhenAskedTo) {
  auto w = world();
  for (bool stop_on_rebalance : {false, true}) {
    PreemptionOptions o = only("none");
    o.stop_on_rebalance = stop_on_rebalance;
    PreemptionMonitor m(o);
    if (w->rank() == 0) m.notify(NoticeKind::kRebalance, "test", "rebalance recommendation");
    EXPECT_EQ(m.agree(*w), NoticeKind::kRebalance);
    EXPECT_EQ(m.should_stop(*w), stop_on_rebalance);
    if (w->rank() == 0) m.notify(NoticeKind::kStop, "test");
    EXPECT_TRUE(m.should_stop(*w));
    if (w->rank() == 0) EXPECT_EQ(m.notice()->source, "test");
  }
}

// A rebalance recommendation is an early warning: decide() asks every rank
// to save at the same step, once, and training goes on; a stop notice
// then stops.
TEST(Preemption, RebalanceAsksForOneSaveAndTrainingContinues) {
  auto w = world();
  PreemptionMonitor m(only("none"));
  EXPECT_EQ(m.decide(*w), PreemptionAction::kContinue);
  if (w->rank() == w->size() - 1) m.notify(NoticeKind::kRebalance, "test", "rebalance");
  EXPECT_EQ(m.decide(*w), PreemptionAction::kSaveNow) << "every rank saves at this step";
  EXPECT_EQ(m.decide(*w), PreemptionAction::kContinue) << "once per recommendation";
  EXPECT_EQ(m.decide(*w), PreemptionAction::kContinue);
  if (w->rank() == 0) m.notify(NoticeKind::kStop, "test");
  EXPECT_EQ(m.decide(*w), PreemptionAction::kStop);
  EXPECT_EQ(m.decide(*w), PreemptionAction::kStop);
  PreemptionOptions o = only("none");
  o.stop_on_rebalance = true;
  PreemptionMonitor strict(o);
  if (w->rank() == 0) strict.notify(NoticeKind::kRebalance, "test");
  EXPECT_EQ(strict.decide(*w), PreemptionAction::kStop);
}

TEST(Preemption, TriggerFileCountsWhenCreatedOrTouchedNotWhenLeftOver) {
  auto w = world();
  const std::string path = "/tmp/tutti-preempt-test-" + std::to_string(::getpid());
  auto poll_until = [](PreemptionMonitor& m, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (m.local() == NoticeKind::kStop) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ::unlink(path.c_str());
  {
    PreemptionOptions o = only("file");
    o.trigger_file = path;
    PreemptionMonitor m(o);
    EXPECT_FALSE(poll_until(m, 0.2));
    std::ofstream(path).put('x');
    EXPECT_TRUE(poll_until(m, 3)) << "creating the file is a notice";
    EXPECT_EQ(m.notice()->source, "file");
  }
  {
    PreemptionOptions o = only("file");
    o.trigger_file = path;  // still there: a leftover
    PreemptionMonitor m(o);
    EXPECT_FALSE(poll_until(m, 0.3)) << "a leftover file is not a notice";
    // A touch: an mtime 5 s past the file's own, distinct under any file
    // system's timestamp granularity (no sleep-and-hope).
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    struct timespec later[2] = {st.st_atim, st.st_mtim};
    later[1].tv_sec += 5;
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), later, 0), 0);
    EXPECT_TRUE(poll_until(m, 3)) << "touching it is";
  }
  ::unlink(path.c_str());
  w->barrier();
}

TEST(Preemption, UnreachableEndpointsAreQuietAndCheap) {
  PreemptionOptions o = only("aws,gcp,azure");
  o.aws_url = o.gcp_url = o.azure_url = "http://127.0.0.1:1";  // refused
  o.http_timeout_ms = 200;
  {
    PreemptionMonitor m(o);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(m.local(), NoticeKind::kNone);
    EXPECT_EQ(m.sources(), (std::vector<std::string>{"aws", "gcp", "azure"}));
  }  // stopping the pollers returns (the ctest timeout bounds a hang)
}

TEST(Preemption, UnknownSourceIsAnError) {
  try {
    PreemptionMonitor m(only("signals,oracle-cloud"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("oracle-cloud"), std::string::npos) << e.what();
  }
  PreemptionMonitor m(only("signals"));  // the failed one released the handlers
  EXPECT_EQ(kPreemptedExitCode, 75);
}

}  // namespace
}  // namespace tutti
