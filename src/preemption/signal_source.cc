#include "preemption/signal_source.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace tutti {
namespace preempt {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGUSR2};

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the signal flag must be lock-free to be async-signal-safe");

std::mutex g_mu;
bool g_installed = false;
struct sigaction g_previous[3];

extern "C" void on_signal(int signo) { g_received.store(signo, std::memory_order_relaxed); }

}  // namespace

bool install_signal_handlers() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_installed) return false;
  g_received.store(0);
  for (int i = 0; i < 3; ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a notice must not fail the I/O in flight
    sigaction(kSignals[i], &sa, &g_previous[i]);
  }
  g_installed = true;
  return true;
}

void restore_signal_handlers() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_installed) return;
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int received_signal() { return g_received.load(std::memory_order_relaxed); }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
  }
  return "signal";
}

}  // namespace preempt
}  // namespace tutti
