// SIGTERM / SIGUSR1 / SIGUSR2 as preemption notices.  The handler only
// stores the signal number in a lock-free atomic (async-signal-safe); the
// monitor reads it.  Handlers are process-wide: one owner at a time.
#pragma once

namespace tutti {
namespace preempt {

// Installs the handlers; false if another monitor already owns them.
bool install_signal_handlers();
// Restores the handlers that were in place before install.
void restore_signal_handlers();
// The last of the three signals received since install, or 0.
int received_signal();
// The pid that sent it (siginfo si_pid; 0 when the kernel or a process in
// another pid namespace sent it).
int received_signal_sender();
const char* signal_name(int signo);

}  // namespace preempt
}  // namespace tutti
