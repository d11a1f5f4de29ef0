// tutti::init() ignores SIGPIPE where the program left it at its default
// (src/comm/mpi/mpi_runtime.cc): Open MPI 5's TCP transport writes to
// sockets whose peer is gone (in MPI_Finalize, and after a peer died) and
// SIGPIPE at its default killed ranks whose work was done.  A program's own
// handler is kept.
//
//   sigpipe_probe default   SIGPIPE at its default before init: ignored
//                           after it, a write to a closed pipe fails with
//                           EPIPE and the process lives
//   sigpipe_probe handler   the program's handler before init: still its
//                           handler after init, and it runs on that write
// Prints "PROBE-OK" on every rank that saw what it expected.
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tutti/tutti.h"

namespace {

volatile sig_atomic_t handled = 0;
void on_pipe(int) { handled = 1; }

// Writes to a pipe whose read end is closed; returns errno (0: no error).
int write_to_closed_pipe() {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  close(fds[0]);
  const char byte = 'x';
  const ssize_t n = write(fds[1], &byte, 1);
  const int err = n < 0 ? errno : 0;
  close(fds[1]);
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "default";
  if (mode == "handler") {
    struct sigaction sa {};
    sa.sa_handler = on_pipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, nullptr);
  } else {
    signal(SIGPIPE, SIG_DFL);
  }
  tutti::init();
  const int rank = tutti::rank();
  struct sigaction now {};
  sigaction(SIGPIPE, nullptr, &now);
  std::string problem;
  if (mode == "handler") {
    if (now.sa_handler != on_pipe) problem = "init() replaced the program's SIGPIPE handler";
    const int err = write_to_closed_pipe();
    if (problem.empty() && (err != EPIPE || !handled))
      problem = "the program's handler did not run (errno " + std::to_string(err) + ")";
  } else {
    if (now.sa_handler != SIG_IGN) problem = "SIGPIPE is not ignored after init()";
    const int err = write_to_closed_pipe();  // at the default this would kill us
    if (problem.empty() && err != EPIPE)
      problem = std::string("the write did not fail with EPIPE: ") + std::strerror(err);
  }
  std::printf("%s rank %d (%s): %s\n", problem.empty() ? "PROBE-OK" : "PROBE-FAIL", rank,
              mode.c_str(), problem.empty() ? "as expected" : problem.c_str());
  std::fflush(stdout);
  tutti::shutdown();
  return problem.empty() ? 0 : 1;
}
