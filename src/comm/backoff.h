// How a host thread waits for something that completes elsewhere: an MPI
// request (mpi::wait_rc), an NCCL enqueue or init settling (nccl::await),
// an NCCL op's kernel and agreement check (CudaWork::synchronize).
//
// Busy-waiting steals the cores the computation runs on (issue 15: 1.9-2.9
// s of CPU for a 3 s wait), so every such wait backs off the same way:
//  1. kSpinPolls back-to-back polls: a small op whose peers are already
//     there completes in a few microseconds;
//  2. polls separated by sched_yield() for the first kYieldUs: a short
//     ring step, an oversubscribed peer's turn;
//  3. polls separated by sleeps growing x2 from kFirstSleepUs up to the cap
//     (TUTTI_MPI_WAIT_SLEEP_US): a late peer, a long transfer.  A
//     completion is seen at most one sleep late, so the added latency is
//     bounded by min(time already waited, the cap).
// A cap <= 0 keeps phase 2 for the whole wait (the former busy wait).
// Phases 1 and 2 are kept short (16 polls, 30 us): every wait pays them,
// and each poll of Open MPI's TCP transport is a poll() system call.  With
// 64 polls and 200 us, the launch chains' waits cost a data-parallel step
// on the netns rig 34-37 ms of CPU per rank for 15 MB of gradients; with
// 16 and 30 us, 24-29 ms, the link time unchanged (bench/RESULTS.md).
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
  static constexpr int kSpinPolls = 16;
  static constexpr int64_t kYieldUs = 30;
  static constexpr int64_t kFirstSleepUs = 20;

  enum class Kind { kSpin, kYield, kSleep };
  struct Step {
    Kind kind;
    int64_t sleep_us;  // kSleep only
    // Whether the waiter should look at its deadline (and stall inspector)
    // now: never while spinning, every 64th yield, before every sleep.
    bool check_clock;
  };

  // cap_us: the longest sleep (wait_sleep_cap_us() for the setting).
  explicit Backoff(int64_t cap_us) : cap_us_(cap_us) {}
  // What to do after a poll that found the wait unfinished, at `now`.
  Step next(Clock::time_point now);
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
  uint64_t polls_ = 0;
  Clock::time_point yield_until_;
  int64_t sleep_us_ = kFirstSleepUs;
};

// TUTTI_MPI_WAIT_SLEEP_US, re-read when the settings generation changes
// (cached per thread: waits run on several threads and must not share a
// lock).
int64_t wait_sleep_cap_us();

}  // namespace comm
}  // namespace tutti
