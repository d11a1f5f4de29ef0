// ProcessGroup internals: the host communicator (MPI, or local for a world
// of one) and lazily created device communicators per CUDA device (NCCL or
// the staged transport, comm/device_transport.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/device_communicator.h"
#include "comm/local/local_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "tutti/process_group.h"

namespace tutti {

class ProcessGroupImpl {
 public:
  ProcessGroupImpl(std::string name, std::shared_ptr<mpi::MpiCommunicator> mpi)
      : name(std::move(name)), mpi(std::move(mpi)) {}
  ProcessGroupImpl(std::string name,
                   std::shared_ptr<comm::LocalCommunicator> local)
      : name(std::move(name)), local(std::move(local)) {}

  CommunicatorPtr host() const {
    return mpi ? CommunicatorPtr(mpi) : CommunicatorPtr(local);
  }

  std::string name;
  std::shared_ptr<mpi::MpiCommunicator> mpi;         // null in a local world
  std::shared_ptr<comm::LocalCommunicator> local;    // null with MPI
  std::mutex mu;
  std::map<int, std::shared_ptr<comm::DeviceCommunicator>> cuda;
  std::shared_ptr<ProcessGroup> node;
  std::shared_ptr<ProcessGroup> cross;
};

}  // namespace tutti
