#include "comm/backoff.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "tutti/config.h"

namespace tutti {
namespace comm {

Backoff::Step Backoff::next(Clock::time_point now) {
  const uint64_t i = polls_++;
  const uint64_t spins = static_cast<uint64_t>(spin_polls_);
  if (i < spins) return {Kind::kSpin, 0, false};
  if (i == spins) yield_until_ = now + std::chrono::microseconds(yield_us_);
  if (cap_us_ <= 0 || now < yield_until_) {
    // Yields are cheap: look at the clock only every 64th of them.
    const bool check = ((i - spins) & 63) == 63;
    return {Kind::kYield, 0, check};
  }
  const int64_t us = std::min(cap_us_, sleep_us_);
  sleep_us_ = std::min(cap_us_, sleep_us_ * 2);
  return {Kind::kSleep, us, true};
}

void Backoff::pause(const Step& step) {
  switch (step.kind) {
    case Kind::kSpin:
      return;
    case Kind::kYield:
      sched_yield();
      return;
    case Kind::kSleep:
      std::this_thread::sleep_for(std::chrono::microseconds(step.sleep_us));
      return;
  }
}

namespace {

std::atomic<bool> g_oversubscribed{false};

// The three wait settings, re-read when the settings generation changes
// (cached per thread: waits run on several threads and must not share a
// lock).
struct WaitSettings {
  int64_t cap_us = 1000;
  int spins = Backoff::kSpinPolls;
  int64_t yield_us = Backoff::kYieldUs;
  bool oversubscribed = false;
};

const WaitSettings& wait_settings() {
  thread_local uint64_t generation = ~uint64_t{0};
  thread_local WaitSettings value;
  const uint64_t g = config::generation();
  const bool over = oversubscribed();
  if (g != generation || over != value.oversubscribed) {
    value.cap_us = config::get_int("TUTTI_MPI_WAIT_SLEEP_US");
    value.spins = static_cast<int>(config::get_int("TUTTI_MPI_WAIT_SPINS"));
    value.yield_us =
        effective_yield_us(config::get_int("TUTTI_MPI_WAIT_YIELD_US"), over);
    value.oversubscribed = over;
    generation = g;
  }
  return value;
}

}  // namespace

Backoff Backoff::from_settings(int64_t min_yield_us) {
  const WaitSettings& w = wait_settings();
  return Backoff(w.cap_us, w.spins, std::max(w.yield_us, min_yield_us));
}

int64_t wait_sleep_cap_us() { return wait_settings().cap_us; }

void set_oversubscribed(bool oversubscribed) {
  g_oversubscribed.store(oversubscribed, std::memory_order_relaxed);
}

bool oversubscribed() { return g_oversubscribed.load(std::memory_order_relaxed); }

int64_t effective_yield_us(int64_t setting, bool oversubscribed) {
  if (setting >= 0) return setting;
  return oversubscribed ? Backoff::kOversubscribedYieldUs : Backoff::kYieldUs;
}

}  // namespace comm
}  // namespace tutti
