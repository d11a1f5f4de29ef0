/* LD_PRELOAD library for tutti_run_teardown-usr1: a SIGUSR1 that lands in
 * the launcher's teardown window, every run instead of once in many.
 *
 * tutti-run repeats SIGUSR1 to mpirun while the job runs, after checking
 * that mpirun handles it.  The check and the kill() are two steps: a repeat
 * sent just before mpirun puts its original disposition back (as it exits)
 * arrives after, and with the default action it kills mpirun with 138 after
 * every rank stopped cleanly with 75.  By timing alone that window (about
 * 30 ms on a 2-core machine) is hit once in many runs.
 *
 * In the process named by TUTTI_TEST_LATE_USR1_IN (the launcher's
 * basename) this library's destructor runs after main() returned, that is
 * after the launcher's own clean-up restored its signal dispositions and
 * before the process ends, and raises SIGUSR1 there once the file named by
 * TUTTI_TEST_LATE_USR1_AFTER exists (the test creates it when it sends the
 * notice, so `mpirun --version` is left alone).  With
 * TUTTI_TEST_LATE_USR1_RESET=1 it first resets SIGUSR1 to the default
 * action, as a launcher that does not restore what it inherited would.  It
 * says on stderr what it found and did, so the test knows it ran. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int in_launcher(void) {
  const char* want = getenv("TUTTI_TEST_LATE_USR1_IN");
  return want != NULL && *want != '\0' && strcmp(program_invocation_short_name, want) == 0;
}

__attribute__((constructor)) static void late_usr1_load(void) {
  /* The launcher's own children (daemons, ranks) do not load it. */
  if (in_launcher()) unsetenv("LD_PRELOAD");
}

__attribute__((destructor)) static void late_usr1_exit(void) {
  if (!in_launcher()) return;
  const char* after = getenv("TUTTI_TEST_LATE_USR1_AFTER");
  if (after == NULL || access(after, F_OK) != 0) return;
  struct sigaction now;
  if (sigaction(SIGUSR1, NULL, &now) != 0) {
    fprintf(stderr, "late-usr1: sigaction(SIGUSR1) failed: %s\n", strerror(errno));
    return;
  }
  const char* found = now.sa_handler == SIG_IGN   ? "ignored"
                      : now.sa_handler == SIG_DFL ? "default"
                                                  : "handled";
  const int reset = getenv("TUTTI_TEST_LATE_USR1_RESET") != NULL;
  if (reset) signal(SIGUSR1, SIG_DFL);
  fprintf(stderr, "late-usr1: SIGUSR1 raised in %s's exit (disposition %s%s)\n",
          program_invocation_short_name, found, reset ? ", reset to default first" : "");
  /* raise() targets this thread: unblocked, the signal is delivered (or
   * discarded) before it returns. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  raise(SIGUSR1);
  fprintf(stderr, "late-usr1: %s survived it\n", program_invocation_short_name);
}
