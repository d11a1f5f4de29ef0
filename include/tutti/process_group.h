// The world, process groups, and tutti's lifetime.
//
//   tutti::init();                       // under mpirun, or alone (world of 1)
//   auto world = tutti::world();
//   world->allreduce(grad, tutti::ReduceOp::kAvg);
//   tutti::shutdown();
//
// A ProcessGroup is a Communicator that routes each operation by the device
// of its tensors: host tensors go over MPI, CUDA tensors over NCCL (created
// lazily for the tensor's device, bootstrapped over MPI), or through host
// memory over MPI where ranks share a device (TUTTI_DEVICE_TRANSPORT,
// docs/communication.md "The staged device transport").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tutti/comm.h"
#include "tutti/export.h"

namespace tutti {

struct InitOptions {
  // "auto": MPI when started by a launcher (mpirun/srun) or when the
  // application already initialised MPI, else a world of one without MPI.
  // "mpi": always MPI (a singleton MPI job without a launcher).
  // "local": a world of one without MPI.  Default from TUTTI_WORLD.
  std::string world;
};

// Initialises tutti (and MPI if it is not initialised yet; tutti then also
// finalises it in shutdown()).  Idempotent.  With an MPI the application
// initialised, tutti cooperates: it duplicates MPI_COMM_WORLD and never
// finalises MPI.  Either way MPI must grant MPI_THREAD_MULTIPLE (tutti's
// threads call MPI): below it, Error(kUnsupported) naming both levels.
// A SIGPIPE left at its default is ignored from init() on (as Python does):
// Open MPI 5's TCP transport writes to sockets of peers that are gone, and
// the signal killed ranks in MPI_Finalize; a program's own handler is kept.
TUTTI_API void init(const InitOptions& options = {});
// Waits for outstanding operations, stops tutti's threads and releases its
// communicators.  Idempotent.  After a timeout made a communicator unusable
// MPI is not finalised (it could hang); the process should exit.
TUTTI_API void shutdown();
TUTTI_API bool initialized();
// The thread level MPI granted tutti's world ("MPI_THREAD_MULTIPLE", the
// only level tutti starts with), or "" when the world runs without MPI (a
// local world of one).  Error(kInvalidArgument) before init().
TUTTI_API std::string mpi_thread_level();

// World rank/size and the position on this node (ranks sharing memory).
TUTTI_API int rank();
TUTTI_API int size();
TUTTI_API int local_rank();
TUTTI_API int local_size();

class ProcessGroupImpl;

class TUTTI_API ProcessGroup : public Communicator {
 public:
  explicit ProcessGroup(std::unique_ptr<ProcessGroupImpl> impl);
  ~ProcessGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "group"; }
  std::string name() const override;
  WorkPtr submit(const OpRequest& request, bool blocking) override;
  std::shared_ptr<Communicator> split(int color, int key,
                                      const std::string& name) override;

  // split(), typed.
  std::shared_ptr<ProcessGroup> split_group(int color, int key,
                                            const std::string& name);
  // The ranks of this group on this node (MPI_COMM_TYPE_SHARED), and one
  // rank per node with the same local rank: the two levels of a
  // hierarchical all-reduce.  Collective; cached after the first call.
  std::shared_ptr<ProcessGroup> node_group();
  std::shared_ptr<ProcessGroup> cross_node_group();
  // World rank of a rank of this group.
  int world_rank(int group_rank) const;
  // The communicator used for host tensors.
  CommunicatorPtr cpu_communicator();
  // The communicator used for tensors on CUDA device `device` (created on
  // first use; collective): backend() "nccl", or "staged" (through host
  // memory over MPI) as TUTTI_DEVICE_TRANSPORT decides.  Error(kUnsupported)
  // in a build without CUDA.
  CommunicatorPtr cuda_communicator(int device);
  // Waits for every operation submitted so far on every backend.
  void synchronize();
  // Uneven inputs (Horovod's hvd.join()): a rank out of data calls join().
  // It blocks until every rank of the group has called it and meanwhile
  // takes part in the collectives the other ranks still run on this group
  // and on its same-membership splits (the reducer's launch channels), with
  // the reduction's identity: 0 for sum and avg (an average still divides
  // by size(): joined ranks count as zeros), 1 for prod, +inf/the largest
  // integer for min, -inf/the lowest for max.  Servable: all-reduce,
  // barrier, and broadcast from a rank that has not joined; any other
  // collective (allgather, reduce-scatter, alltoall, a split, a broadcast
  // from a joined root) is Error(kMismatch) on every running rank, which no
  // rank ran.  Returns the rank that joined last (ties: the highest), the
  // same on every rank.  Error(kUnsupported) on a group that has a
  // communicator for CUDA tensors (NCCL or staged) and with
  // TUTTI_CHECK_COLLECTIVES=0; Error(kTimeout) after
  // TUTTI_TIMEOUT without any collective on the group's family.
  // docs/communication.md, "Uneven inputs".
  int join();

 private:
  std::unique_ptr<ProcessGroupImpl> impl_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// The world group.  Error(kInvalidArgument) before init().
TUTTI_API ProcessGroupPtr world();

}  // namespace tutti
