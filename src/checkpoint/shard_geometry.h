// Where a locally held tensor sits inside its global tensor, and which
// elements two such placements share: the arithmetic behind resharding.
//
// Every placement is reduced to "runs": maximal ranges of consecutive
// elements of the row-major global tensor, listed in the order the local
// tensor stores them.
//   replicated             one run, the whole tensor
//   flat (ZeRO)            one run [offset, offset + numel)
//   split along dim d      one run per index of the dimensions before d
//                          (a single run when d == 0)
// Loading intersects the runs of each stored piece with the runs of the
// destination, skipping elements an earlier piece already provided (pieces
// overlap when, say, a TP shard is replicated over DP ranks).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/state.h"

namespace tutti {
namespace ckpt {

struct Placement {
  std::vector<int64_t> local_shape;
  std::vector<int64_t> global_shape;
  int dim = -1;         // split dimension, -1 when not split
  int64_t offset = 0;   // start along dim, or flat start
  bool flat = false;
  bool replicated() const { return dim < 0 && !flat; }
};

// "[2, 3]"
std::string shape_str(const std::vector<int64_t>& shape);

// Checks a tensor's ShardInfo against its local shape and fills in the
// global shape of a replicated tensor.  Failures are Error(`code`) naming
// `what` (kInvalidArgument for a caller's state, kCorrupt for a file).
Placement make_placement(const std::vector<int64_t>& local_shape,
                         const ShardInfo& info, ErrorCode code,
                         const std::string& what);

// A per-rank tensor (ShardInfo::per_rank) as the checkpoint stores it: the
// local tensor viewed as [1, ...local shape], row `rank` of
// [world, ...local shape] (dim 0, offset rank).  Other tensors unchanged.
// kInvalidArgument when a per-rank tensor also sets global_shape, dim or
// flat, or has kMaxDims dimensions already.
NamedTensor per_rank_as_stored(const NamedTensor& nt, int rank, int world);
void per_rank_as_stored(StateDict* state, int rank, int world);

struct Run {
  uint64_t begin = 0;  // global element index
  uint64_t len = 0;
};
std::vector<Run> placement_runs(const Placement& p);

// Elements to copy: `len` elements from source-local element `src` to
// destination-local element `dst`.
struct CopyRange {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t len = 0;
};

// Disjoint ranges of global elements, for tracking what a destination has
// received.
class IntervalSet {
 public:
  // Adds [b, e); returns the parts of it that were not present yet.
  std::vector<Run> add(uint64_t b, uint64_t e);
  uint64_t total() const { return total_; }
  // The first missing range inside [0, n), or {n, 0} if none.
  Run first_gap(uint64_t n) const;

 private:
  std::map<uint64_t, uint64_t> spans_;  // begin -> end
  uint64_t total_ = 0;
};

// What the source placement contributes to the destination that `covered`
// does not hold yet (covered is updated).  Both must have the same global
// shape.  Ranges come sorted by src, adjacent ones merged.
std::vector<CopyRange> plan_copies(const std::vector<Run>& src,
                                   const std::vector<Run>& dst,
                                   IntervalSet& covered);

}  // namespace ckpt
}  // namespace tutti
