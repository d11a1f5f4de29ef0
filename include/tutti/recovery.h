// In-process recovery from dead ranks (docs/elastic.md, "A killed process:
// recovery in the process").  Needs an MPI with ULFM, Open MPI 5, launched
// with `mpiexec --with-ft ulfm` (through tutti-run: after its `--`).
//
//   try {
//     world->allreduce(grad, tutti::ReduceOp::kSum);
//   } catch (const tutti::Error& e) {
//     if (e.code() != tutti::ErrorCode::kRanksLost) throw;
//     tutti::RecoveryResult r = tutti::recover();  // every survivor calls it
//     // tutti::world() now holds the r.new_size survivors: rebuild groups,
//     // reducers, meshes and optimizers over it, reload the state.
//   }
//
// When a rank dies, every survivor's pending and later operation on a
// communicator that includes it fails with Error(kRanksLost) naming the
// dead world ranks; the first survivor to see it revokes every tutti
// communicator, so that ranks blocked in other operations fail too.
#pragma once

#include <vector>

#include "tutti/export.h"

namespace tutti {

struct RecoveryResult {
  std::vector<int> lost;  // world ranks (before the recovery) that died
  int old_size = 0;
  int new_size = 0;       // tutti::size() from now on
  int new_rank = 0;       // tutti::rank() from now on (survivors keep their order)
  int attempts = 0;       // shrinks it took (a rank died during one: 2)
  double seconds = 0;     // time spent in recover()
  // recover(RecoveryOptions) with tp_size > 1 only: the survivors whose
  // tensor-parallel group lost a member, as world ranks before the recovery
  // (they leave the job with their group; new_size and new_rank count the
  // others; new_rank is -1 on a leaving rank), and whether this rank is
  // one of them.
  std::vector<int> left;
  bool leaving = false;
};

struct RecoveryOptions {
  // The world is a TP x DP mesh (tutti::ProcessMesh: tp_size consecutive
  // world ranks form a TP group).  1: no tensor parallelism.
  int tp_size = 1;
};

// True when this run can recover in-process: tutti runs over an MPI built
// with ULFM, launched with fault tolerance on (`mpiexec --with-ft ulfm`),
// and TUTTI_ULFM is not 0.  False before init() and in a local world.
TUTTI_API bool recovery_available();

// Under tutti-run (TUTTI_EXIT_ON_COMM_FAILURE=1, its default) a lost rank
// ends every survivor with exit code 76 so that tutti-run restarts the job.
// While a RecoveryScope lives, kRanksLost is raised to the program instead,
// which recovers in-process (elastic_run and tutti.torch.elastic.run hold
// one while ULFM is on).  Other peer failures (kTimeout, kCommFailure) end
// the process as before.
class TUTTI_API RecoveryScope {
 public:
  RecoveryScope();
  ~RecoveryScope();
  RecoveryScope(const RecoveryScope&) = delete;
  RecoveryScope& operator=(const RecoveryScope&) = delete;
};

// Collective among the survivors: acknowledges the failures, shrinks tutti's
// world (MPIX_Comm_shrink; a rank dying meanwhile makes it shrink again) and
// rebuilds it over the survivors: world(), rank(), size(), local_rank() and
// local_size() describe them.  Every group derived from the old world (its
// splits, node groups, NCCL and staged device communicators; NCCL ones are
// aborted) is released: an operation on an old ProcessGroup fails with
// kAborted; build new groups from world().  Error(kUnsupported) when
// recovery_available() is false; kRanksLost when the shrink kept failing.
TUTTI_API RecoveryResult recover();

// Tensor-parallel jobs (docs/elastic.md, "Tensor parallel jobs"): recover(),
// then a TP group that lost a member drops out as a whole DP replica.  Its
// surviving members get leaving = true: tutti's world over them is released
// (every op on it fails with kAborted) and they should end the process
// (elastic_run and tutti.torch.elastic.run exit 0 for them, logged).  The
// others form the new world in their old order: complete TP groups stay
// contiguous and every rank keeps its TP index (world rank % tp_size, its
// weight shards), only DP ranks move down; build the ProcessMesh again over
// world() with the same tp_size.  Collective among the survivors;
// kInvalidArgument when tp_size does not divide the world size (checked
// before anything changes); kRanksLost when no complete TP group survives
// (then nothing can go on in-process: the restart path) or a rank died
// during the split.  tp_size 1 is recover().
TUTTI_API RecoveryResult recover(const RecoveryOptions& options);

}  // namespace tutti
