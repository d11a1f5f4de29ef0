// Every communicator tutti creates is registered here so that shutdown() can
// drain and free them before MPI_Finalize, even if the application still
// holds references to groups.
#pragma once

#include <memory>

#include "tutti/error.h"

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace comm {
class DeviceCommunicator;

void register_communicator(const std::shared_ptr<mpi::MpiCommunicator>& c);
// NCCL and staged communicators: shutdown() closes them before the MPI ones.
void register_communicator(const std::shared_ptr<DeviceCommunicator>& c);
// A communicator timed out (its requests may never complete): shutdown()
// must not finalise MPI, even once that communicator is gone.
void note_communicator_poisoned();
// A communicator broke with `error`.  A peer or network failure (kTimeout,
// kCommFailure; kNccl too) is noted as above; for kTimeout and kCommFailure
// with TUTTI_EXIT_ON_COMM_FAILURE set, the error is printed and the process
// ends with kCommFailureExitCode.  kRanksLost (ULFM) is noted and ends the
// process alike, unless a RecoveryScope lives (tutti/recovery.h).
void communicator_broke(const Error& error);

}  // namespace comm
}  // namespace tutti
