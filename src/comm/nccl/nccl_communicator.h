// Communicator over NCCL for CUDA tensors.
//
// Bootstrapped over the group's host communicator (rank 0's ncclUniqueId is
// broadcast over MPI).  Operations run on the communicator's own
// high-priority stream: at submission an event is recorded on the caller's
// stream (OpOptions::stream) and the communication stream waits on it; the
// op's completion event is what Work::wait() makes the caller's stream wait
// for, so neither side blocks the host.  The agreement check runs on the
// host over a private MPI communicator before the NCCL call is enqueued.
// Work::synchronize() polls completion against TUTTI_TIMEOUT and aborts the
// NCCL communicator (ncclCommAbort) on expiry.
#pragma once

#include <memory>
#include <string>

#include "tutti/comm.h"

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace nccl {

class NcclCommunicatorImpl;

class NcclCommunicator : public Communicator {
 public:
  // Collective over `host` (null: a world of one).  `device` is this rank's
  // CUDA ordinal.  Error(kUnsupported) in builds without NCCL.
  static std::shared_ptr<NcclCommunicator> create(
      std::shared_ptr<mpi::MpiCommunicator> host, int device,
      const std::string& name);

  ~NcclCommunicator() override;
  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }
  std::string name() const override;
  int device() const;
  WorkPtr submit(const OpRequest& request, bool blocking) override;
  // Not used directly: ProcessGroup splits its host communicator and then
  // calls split_with().
  std::shared_ptr<Communicator> split(int color, int key,
                                      const std::string& name) override;
  // ncclCommSplit, collective over this communicator; `host_child` is the
  // matching split of the host communicator (null for color < 0).
  std::shared_ptr<NcclCommunicator> split_with(
      int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
      const std::string& name);
  void drain();
  void close();

 private:
  explicit NcclCommunicator(std::unique_ptr<NcclCommunicatorImpl> impl);
  std::unique_ptr<NcclCommunicatorImpl> impl_;
};

}  // namespace nccl
}  // namespace tutti
