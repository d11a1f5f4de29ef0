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

std::atomic<int> g_sender{0};

// The sender first, then the signal: a reader that sees the signal sees its
// sender (or a later one's).
extern "C" void on_signal(int signo, siginfo_t* info, void*) {
  g_sender.store(info != nullptr ? static_cast<int>(info->si_pid) : 0, std::memory_order_relaxed);
  g_received.store(signo, std::memory_order_release);
}

}  // namespace

bool install_signal_handlers() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_installed) return false;
  g_received.store(0);
  g_sender.store(0);
  for (int i = 0; i < 3; ++i) {
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;  // SA_RESTART: a notice must not fail the I/O in flight
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

int received_signal() { return g_received.load(std::memory_order_acquire); }
int received_signal_sender() { return g_sender.load(std::memory_order_relaxed); }

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
