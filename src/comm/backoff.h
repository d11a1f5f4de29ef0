// How a host thread waits for something that completes elsewhere: an MPI
// request (mpi::wait_rc), an NCCL enqueue or init settling (nccl::await),
// an NCCL op's kernel and agreement check (CudaWork::synchronize).
//
// Busy-waiting steals the cores the computation runs on (issue 15: 1.9-2.9
// s of CPU for a 3 s wait), so every such wait backs off the same way:
//  1. kSpinPolls back-to-back polls: a small op whose peers are already
//     there completes in a few microseconds;
//  2. polls separated by sched_yield() for the first kYieldUs: one ring
//     step of a large message, an oversubscribed peer's turn;
//  3. polls separated by sleeps growing x2 from kFirstSleepUs up to the cap
//     (TUTTI_MPI_WAIT_SLEEP_US): a late peer, a long transfer.  A
//     completion is seen at most one sleep late, so the added latency is
//     bounded by min(time already waited, the cap).
// A cap <= 0 keeps phase 2 for the whole wait (the former busy wait).
// When more ranks share the machine than it has cores (mpirun
// --oversubscribe), phase 2 lasts kOversubscribedYieldUs by default: there
// a sleeping waiter wakes late behind its busy peers, and a small
// collective's latency grew ~5x (tests/compression convergence at 4 ranks
// on 2 cores: 34 s with 200 us, 6-7 s with 1-5 ms); yielding costs little
// CPU there, since a peer is always ready to take the core.
// The policy is a pure function of the poll count and the clock, so tests
// drive it with a fake clock (tests/comm/test_comm_units.cc).
#pragma once

#include <chrono>
#include <cstdint>

namespace tutti {
namespace comm {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSpinPolls = 64;
  static constexpr int64_t kYieldUs = 200;
  static constexpr int64_t kOversubscribedYieldUs = 2000;
  static constexpr int64_t kFirstSleepUs = 20;

  enum class Kind { kSpin, kYield, kSleep };
  struct Step {
    Kind kind;
    int64_t sleep_us;  // kSleep only
    // Whether the waiter should look at its deadline (and stall inspector)
    // now: never while spinning, every 64th yield, before every sleep.
    bool check_clock;
  };

  // cap_us: the longest sleep (wait_sleep_cap_us() for the setting);
  // spin_polls and yield_us: phases 1 and 2 (TUTTI_MPI_WAIT_SPINS and
  // TUTTI_MPI_WAIT_YIELD_US; the defaults are theirs on a machine with a
  // core per rank).
  explicit Backoff(int64_t cap_us, int spin_polls = kSpinPolls,
                   int64_t yield_us = kYieldUs)
      : cap_us_(cap_us), spin_polls_(spin_polls < 0 ? 0 : spin_polls),
        yield_us_(yield_us < 0 ? 0 : yield_us) {}
  // The policy the settings give (cap, spins, yield), read on this thread;
  // the yield phase lasts at least `min_yield_us`.
  static Backoff from_settings(int64_t min_yield_us = 0);
  // What to do after a poll that found the wait unfinished, at `now`.
  Step next(Clock::time_point now);
  // The wait moved (a round of a schedule completed, more rounds follow):
  // back to the spin phase, and the next sleep is kFirstSleepUs again, so
  // that a schedule that keeps advancing never waits a sleep per round
  // (log_coll.h).  A waiter calls it at most once per round, so a wait
  // whose peer is late still reaches the sleeps (test_wait_cpu's bound).
  void progressed() {
    polls_ = 0;
    sleep_us_ = kFirstSleepUs;
  }
  // Does it: nothing, sched_yield(), or sleeps.
  static void pause(const Step& step);
  // next(Clock::now()) then pause(); returns the step (for check_clock).
  Step next_and_pause() {
    const Step s = next(Clock::now());
    pause(s);
    return s;
  }

 private:
  int64_t cap_us_;
  int spin_polls_;
  int64_t yield_us_;
  uint64_t polls_ = 0;
  Clock::time_point yield_until_;
  int64_t sleep_us_ = kFirstSleepUs;
};

// TUTTI_MPI_WAIT_SLEEP_US, re-read when the settings generation changes
// (cached per thread: waits run on several threads and must not share a
// lock).
int64_t wait_sleep_cap_us();

// Whether more ranks run on this machine than it has cores: init() sets it
// from the node group's size.  TUTTI_MPI_WAIT_YIELD_US=-1 (the default)
// then means kOversubscribedYieldUs instead of kYieldUs.
void set_oversubscribed(bool oversubscribed);
bool oversubscribed();
// The yield phase a setting gives: the setting itself when >= 0, else the
// default for `oversubscribed`.
int64_t effective_yield_us(int64_t setting, bool oversubscribed);

}  // namespace comm
}  // namespace tutti
