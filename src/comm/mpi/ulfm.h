// ULFM, MPI's fault-tolerance extension (Open MPI 5 under
// `mpiexec --with-ft ulfm`): a peer's death becomes an error on the
// survivors' operations instead of the end of the job, and the survivors
// shrink the world and go on (tutti::recover(), docs/elastic.md).
//
// Everything here compiles on every MPI: without the extension (Debian's
// Open MPI 4.1, MPICH, a cluster's MPI) compiled() and enabled() are false
// and nothing changes.  Built with it but launched without
// `--with-ft ulfm`, enabled() is false too: a dead peer ends the job as
// before.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace tutti {
namespace mpi {
namespace ulfm {

// Built against an MPI whose mpi-ext.h declares MPIX_Comm_shrink.
bool compiled();
// compiled() and fault tolerance on in this run (Open MPI's MPI_T control
// variable mpi_ft_enable, which `mpiexec --with-ft ulfm` sets).  Call after
// MPI_Init; cached.  TUTTI_ULFM=0 turns it off (a dead peer then fails ops
// with kMpi, as on an MPI without ULFM under --with-ft).
bool enabled();
// `rc` reports a dead process: MPIX_ERR_PROC_FAILED, _PENDING or
// MPIX_ERR_REVOKED (a survivor revoked the communicator), and enabled().
bool is_failure(int rc);

// The communicator whose ranks are tutti's world ranks: MPI_COMM_WORLD
// until a recovery, then the shrunken world (set_base()).
MPI_Comm base();
// After a recovery: `comm` (owned here from now on) numbers the world.
void set_base(MPI_Comm comm);

// The dead processes this rank knows of, as ranks of base() (sorted),
// waiting up to `wait_s` while it knows of none (a revoke can arrive before
// the failure notice).
std::vector<int> failed_ranks(double wait_s);
// MPIX_Comm_revoke(comm) when enabled() (a revoked communicator fails every
// pending and later operation on every member); logged, never thrown.
void revoke(MPI_Comm comm);
// Runs `fn` once at the first failure seen after set_on_failure() (world.cc:
// revoke every tutti communicator, so that ranks blocked in other ops fail
// promptly).  Re-armed by every call.
void set_on_failure(std::function<void()> fn);

// For the watchdogs of device operations (NCCL, comm/watchdog.h), asked at
// every pass: "" while this process knows of no dead peer, else "world
// rank(s) 2 died (...)": a kRanksLost raised on any thread of this process,
// or MPI's failure detector (MPIX_Comm_get_failed on base(), asked at most
// every 50 ms).  Always "" without ULFM.  Any thread.
std::string failure_note();

// Tests only (tests/elastic/ulfm_ops_probe.cc): `fn(attempt)` runs inside
// shrink() after each MPIX_Comm_shrink that succeeded, before the
// agreement that confirms it, so that a test process can die exactly
// there; null removes it.
void set_shrink_test_hook(std::function<void(int attempt)> fn);

// What TUTTI_MPI_CHECK throws for an is_failure() code: Error(kRanksLost)
// "rank R: <context>: world rank(s) 2 died (MPI_Xxx: <MPI's text>); call
// tutti::recover() ...".  Runs the on-failure hook first.
[[noreturn]] void throw_ranks_lost(int rc, const char* expr, const std::string& context,
                                   const char* file, int line);

struct Shrunk {
  MPI_Comm comm = MPI_COMM_NULL;  // the survivors, in their old order
  std::vector<int> lost;          // ranks of `old` not in it (sorted)
  int attempts = 0;               // shrinks it took (a failure during one retries)
  double shrink_s = 0;            // seconds in MPIX_Comm_shrink (all attempts)
  double agree_s = 0;             // seconds in MPIX_Comm_agree (all attempts)
};
// Collective among the survivors of `old` (revoked or not): acknowledges the
// failures, MPIX_Comm_shrink, then MPIX_Comm_agree on the new communicator;
// a process that dies meanwhile makes the agreement fail on every member and
// the shrink runs again (at most `max_attempts` times, then kRanksLost).
// The new communicator returns errors (MPI_ERRORS_RETURN).
Shrunk shrink(MPI_Comm old, int max_attempts = 8);

}  // namespace ulfm
}  // namespace mpi
}  // namespace tutti
