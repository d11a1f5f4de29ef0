// Communicator over NCCL for CUDA tensors.
//
// Bootstrapped over the group's host communicator (rank 0's ncclUniqueId is
// broadcast over MPI) as a non-blocking NCCL communicator, so that init,
// split, finalize and every enqueue are bounded by TUTTI_TIMEOUT.
// Operations run on the communicator's own high-priority stream: at
// submission an event is recorded on the caller's stream (OpOptions::stream)
// and the communication stream waits on it; the op's completion event is
// what Work::wait() makes the caller's stream wait for, so neither side
// blocks the host.
//
// The agreement check overlaps with the op: the engine posts the
// fingerprint all-reduce (MPI, non-blocking) and enqueues the NCCL call at
// once; the watchdog completes the check.  Every started op is watched
// (comm/watchdog.h): on a timeout, an NCCL asynchronous error or a
// mismatch the NCCL communicator is aborted and marked broken, every op in
// flight fails, and later ones fail with kAborted.
#pragma once

#include <memory>
#include <string>

#include "comm/device_communicator.h"
#include "tutti/comm.h"

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace nccl {

class NcclCommunicatorImpl;

class NcclCommunicator : public comm::DeviceCommunicator {
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
  int device() const override;
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
  std::shared_ptr<comm::DeviceCommunicator> split_device(
      int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
      const std::string& name) override {
    return split_with(color, key, std::move(host_child), name);
  }
  // Waits until the engine has enqueued everything submitted so far.
  void drain() override;
  // Waits until everything submitted so far has completed on the GPU
  // (bounded by the watchdog); rethrows the newest op's error.
  void synchronize() override;
  // Waits for the ops in flight, then finalises the NCCL communicator
  // (aborts it if that does not finish within TUTTI_TIMEOUT).  Idempotent.
  void close() override;
  // Aborts the NCCL communicator (kernels in flight end), then closes it.
  void abandon() override;
  // True once the watchdog aborted the communicator.
  bool broken() const override;

 private:
  explicit NcclCommunicator(std::shared_ptr<NcclCommunicatorImpl> impl);
  // Shared with the Works, which hold it weakly: a Work that outlives its
  // communicator, or races its abort, never touches freed state.
  std::shared_ptr<NcclCommunicatorImpl> impl_;
};

}  // namespace nccl
}  // namespace tutti
