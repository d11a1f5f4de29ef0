// The staged device transport: a Communicator for CUDA tensors that runs
// every operation through the group's host communicator (MPI), staging the
// data through pinned host memory.  It serves where NCCL cannot: ranks that
// share a GPU (NCCL refuses two ranks of a communicator on one device), and
// builds without NCCL (TUTTI_DEVICE_TRANSPORT, comm/device_transport.h).
//
// One operation, on the communicator's progress engine (in submission
// order, like every backend):
//   submission   an event marks the caller's stream (OpOptions::stream);
//   1. validate  the device request (shapes, dtypes, counts, this device);
//   2. stage     device -> pinned staging buffers on the communicator's own
//                stream, after that event; the host waits for the copies
//                (TUTTI_TIMEOUT: a stream that never reaches the op fails it);
//   3. exchange  the same collective over the staging buffers through the
//                host communicator: the agreement check, TUTTI_TIMEOUT, the
//                stall inspector and the error texts (op, sequence number,
//                the ranks that never arrived) are the MPI path's, and the
//                results are the MPI path's bit for bit (same reductions);
//                a rank whose request failed step 1 still takes part in the
//                check, marked invalid, so its peers fail at once;
//   4. unstage   staging -> device on the same stream, then an event that
//                Work::wait() makes the caller's stream wait for.
// The host communicator is a private duplicate of the group's (a split of
// every rank), so device ops have their own sequence numbers and never
// interleave with the group's host ops in a timing-dependent order.
// Staging buffers come from a pool per communicator (no allocation once
// warm); copies and their reuse are ordered as copier.h explains.
//
// The copies go through a Copier (copier.h): CUDA here, memcpy in CI,
// where this same code runs on host tensors (tests/comm/test_staged.cc).
#pragma once

#include <memory>
#include <string>

#include "comm/device_communicator.h"
#include "comm/staged/copier.h"

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace staged {

class StagedCommunicatorImpl;

class StagedCommunicator : public comm::DeviceCommunicator {
 public:
  // For the tensors on CUDA device `device`: collective over `host` (a
  // duplicate is split off it, in order with its ops; null: a world of one).
  static std::shared_ptr<StagedCommunicator> create(
      std::shared_ptr<mpi::MpiCommunicator> host, int device, const std::string& name);
  // The same over `copier` (a MemcpyCopier serves host tensors: tests).
  static std::shared_ptr<StagedCommunicator> create(
      std::shared_ptr<mpi::MpiCommunicator> host, std::unique_ptr<Copier> copier,
      const std::string& name);

  ~StagedCommunicator() override;
  int rank() const override;
  int size() const override;
  std::string backend() const override { return "staged"; }
  std::string name() const override;
  // The CUDA ordinal served (-1 for a host copier).
  int device() const override;
  WorkPtr submit(const OpRequest& request, bool blocking) override;
  // Not used directly: split the ProcessGroup (its host communicator must
  // split alongside).
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override;
  // Splits this communicator's own host duplicate (collective over it, in
  // order with its ops); `host_child` is not needed.
  std::shared_ptr<comm::DeviceCommunicator> split_device(
      int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
      const std::string& name) override;
  void drain() override;
  void synchronize() override;
  // Drains, waits for the copies in flight (TUTTI_TIMEOUT) and closes the
  // host duplicate.  Idempotent.
  void close() override;
  bool broken() const override;

  // Staging buffers allocated so far (tests: the pool stops growing).
  size_t staging_allocations() const;

 private:
  explicit StagedCommunicator(std::shared_ptr<StagedCommunicatorImpl> impl);
  // Shared with the Works' failure callbacks, which hold it weakly.
  std::shared_ptr<StagedCommunicatorImpl> impl_;
};

}  // namespace staged
}  // namespace tutti
