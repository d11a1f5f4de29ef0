// Waits that progress a schedule round by round do not add a sleep per
// round (comm::Backoff::progressed(), mpi::poll_until): on a fake clock, a
// wait over many short rounds never sleeps when each completed round
// starts the backoff over, and does sleep (up to the cap, per round) when
// it does not; a stalled wait still reaches its sleeps; the yield phase
// stretches to a modelled duration.  One rank, no peers.
#include <gtest/gtest.h>

#include <chrono>

#include "comm/backoff.h"
#include "comm/mpi/mpi_runtime.h"

namespace tutti {
namespace comm {
namespace {

using us = std::chrono::microseconds;
using Clock = Backoff::Clock;

TEST(BackoffProgress, ProgressedStartsOverWithSpinsAndTheFirstSleep) {
  Backoff b(1000, 4, 100);
  auto now = Clock::time_point{} + std::chrono::seconds(1);
  // Into the sleeps: 4 spins, yields for 100 us, then 20, 40, 80 ...
  Backoff::Step s{};
  int sleeps = 0;
  while (sleeps < 4) {
    s = b.next(now);
    if (s.kind == Backoff::Kind::kSleep) {
      ++sleeps;
      now += us(s.sleep_us);
    } else {
      now += us(1);
    }
  }
  EXPECT_EQ(s.sleep_us, 160);
  b.progressed();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.next(now).kind, Backoff::Kind::kSpin) << i;
  EXPECT_EQ(b.next(now).kind, Backoff::Kind::kYield);
  now += us(99);
  EXPECT_EQ(b.next(now).kind, Backoff::Kind::kYield);
  now += us(2);
  s = b.next(now);
  EXPECT_EQ(s.kind, Backoff::Kind::kSleep);
  EXPECT_EQ(s.sleep_us, Backoff::kFirstSleepUs) << "the sleeps start over too";
}

// A schedule of `rounds` rounds, each completing `round_us` after the
// waiter saw the previous one (its partner needs that long).  The waiter
// polls as Backoff says; a spin costs 0.1 us, a yield 1 us, a sleep its
// length.  Returns the sleeps taken and the added latency (detection -
// completion, summed over rounds).
struct Waited {
  int sleeps = 0;
  double late_us = 0;
};
Waited wait_rounds(int rounds, int64_t round_us, bool progressed) {
  Backoff b(1000, 64, 200);
  double now = 0, done_at = static_cast<double>(round_us);
  const auto t0 = Clock::time_point{} + std::chrono::seconds(1);
  Waited w;
  for (int r = 0; r < rounds;) {
    if (now >= done_at) {  // the poll sees the round complete
      w.late_us += now - done_at;
      ++r;
      done_at = now + static_cast<double>(round_us);
      if (progressed) b.progressed();
      continue;
    }
    const Backoff::Step s =
        b.next(t0 + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double, std::micro>(now)));
    switch (s.kind) {
      case Backoff::Kind::kSpin: now += 0.1; break;
      case Backoff::Kind::kYield: now += 1.0; break;
      case Backoff::Kind::kSleep:
        ++w.sleeps;
        now += static_cast<double>(s.sleep_us);
        break;
    }
  }
  return w;
}

TEST(BackoffProgress, ARoundByRoundWaitAddsNoSleepPerRound) {
  // 50 rounds of 150 us: each fits the 200 us yield phase.
  const Waited with = wait_rounds(50, 150, true);
  EXPECT_EQ(with.sleeps, 0);
  EXPECT_LE(with.late_us, 50 * 1.0) << "at most one yield late per round";
  // Without starting over, the wait is in its sleeps from the second round
  // on and notices each round up to a capped sleep late.
  const Waited without = wait_rounds(50, 150, false);
  EXPECT_GT(without.sleeps, 40);
  EXPECT_GT(without.late_us, 50 * with.late_us + 10000.0);
}

TEST(BackoffProgress, AStalledWaitStillSleeps) {
  // One round completes, then the partner is 2 s late: the wait yields for
  // 200 us once more and then sleeps, as without progress (test_wait_cpu's
  // CPU bound rests on this).
  const Waited w = wait_rounds(2, 2000000, true);
  EXPECT_GT(w.sleeps, 2 * 1900);  // 2 s in sleeps of at most 1 ms
  EXPECT_LE(w.late_us, 2 * 1000.0 + 2);
}

TEST(BackoffProgress, TheYieldPhaseStretchesToTheModelledDuration) {
  EXPECT_EQ(mpi::modelled_us(2, 0), 20);
  EXPECT_EQ(mpi::modelled_us(14, 8 << 20), 140 + 8388);
  EXPECT_EQ(mpi::modelled_us(14, int64_t{1} << 40), 20000) << "capped at 20 ms";
  Backoff b = Backoff(1000, 0, std::max<int64_t>(200, mpi::modelled_us(14, 8 << 20)));
  auto now = Clock::time_point{} + std::chrono::seconds(1);
  const auto start = now;
  while (b.next(now).kind != Backoff::Kind::kSleep) now += us(50);
  EXPECT_GE(now - start, us(140 + 8388));
}

TEST(BackoffProgress, PollUntilStartsOverOnEveryProgress) {
  // 5000 polls that each complete a round: spins only, so it returns at
  // once (without starting over, 5000 polls take seconds of sleeps).
  int polls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(mpi::poll_until(
      [&](bool* progressed) {
        *progressed = true;
        return ++polls == 5000;
      },
      mpi::Deadline(30)));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 0.5);
  // A poll that never completes ends at its deadline.
  EXPECT_FALSE(mpi::poll_until([](bool*) { return false; }, mpi::Deadline(0.05)));
}

}  // namespace
}  // namespace comm
}  // namespace tutti
