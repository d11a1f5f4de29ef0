// What a ProcessGroup needs of the communicator that serves its CUDA tensors
// on one device, whichever transport it is: NCCL (comm/nccl/) or the staged
// transport through host memory (comm/staged/).  The group keeps one per
// device, splits it alongside its host communicator, waits for it in
// synchronize() and shutdown() closes it before MPI.
//
// Work semantics, the same for both: Work::wait() blocks the host until the
// op is enqueued on the communicator's stream (NCCL: the kernel; staged: the
// host-to-device copy of the result, i.e. after the host collective ended),
// then makes OpOptions::stream wait for it; synchronize() blocks until the
// device finished it; test() polls.
#pragma once

#include <memory>
#include <string>

#include "tutti/comm.h"

namespace tutti {
namespace mpi {
class MpiCommunicator;
}
namespace comm {

class DeviceCommunicator : public Communicator {
 public:
  // The CUDA ordinal whose tensors it serves.
  virtual int device() const = 0;
  // Waits until every op submitted so far has been started (enqueued).
  virtual void drain() = 0;
  // Waits until every op submitted so far has completed on the device;
  // rethrows the newest op's error.
  virtual void synchronize() = 0;
  // Finishes the ops in flight and releases the communicator (bounded by
  // TUTTI_TIMEOUT).  Idempotent; later ops fail with kAborted.
  virtual void close() = 0;
  // tutti::recover(): releases the communicator without waiting for peers,
  // some of which died (NCCL: ncclCommAbort, never a finalize or destroy,
  // which can wait for them forever).  Later ops fail with kAborted.
  virtual void abandon() { close(); }
  // True once a failure made the communicator unusable.
  virtual bool broken() const = 0;
  // The split of this communicator that goes with `host_child`, the split
  // (color, key) of the group's host communicator (null for color < 0).
  // Collective over this communicator, in order with its ops.  Returns null
  // where this rank is not in the child.
  virtual std::shared_ptr<DeviceCommunicator> split_device(
      int color, int key, std::shared_ptr<mpi::MpiCommunicator> host_child,
      const std::string& name) = 0;
};

}  // namespace comm
}  // namespace tutti
