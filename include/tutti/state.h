// Component state as named tensors, the unit checkpoints save and restore.
//
// Every stateful part of tutti (loss scaler, compressors, optimiser state a
// user registers, model parameters) describes its state as a list of
// NamedTensor views into its own memory.  Saving reads them; loading writes
// into the same views and then calls on_state_loaded().  Small scalar state
// (a loss scale, a step counter) is a 1-element tensor, so one mechanism
// carries everything and restores it bit-exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/tensor.h"

namespace tutti {

// What a per-rank tensor's resize hook gets (ShardInfo::on_resize): the
// checkpoint was written by `saved_world` ranks and is loaded by `world`.
struct PerRankResize {
  std::string name;     // the tensor's name in the checkpoint
  Tensor saved;         // host memory, [saved_world, ...local shape]: row r
                        // is what rank r saved
  int saved_world = 0;
  int world = 0;        // the loading group's size and this rank in it
  int rank = 0;
  Tensor dst;           // the tensor to write (the owner's own view)
};

// How a tensor relates to the global (unsharded) tensor it is part of.
struct ShardInfo {
  // Global shape; empty means "same as the local tensor" (not sharded).
  std::vector<int64_t> global_shape;
  // Dimension along which this rank holds a slice; -1: replicated (every
  // rank of `group` holds the whole tensor).
  int dim = -1;
  // Start of this rank's slice along `dim`.
  int64_t offset = 0;
  // The group the tensor is sharded or replicated over: "world", "dp", "tp"
  // (informational; the loader uses global_shape/dim/offset to reshard).
  std::string group = "world";
  // Flat ZeRO-style sharding: the global tensor is flattened and this rank
  // holds elements [offset, offset + numel) of it (dim is ignored).
  bool flat = false;
  // Per-rank state: every rank of the checkpoint's group holds its own value
  // (error-feedback residuals, a rank's RNG).  The checkpoint stores it as
  // row <rank> of a [world, ...local shape] tensor (leave global_shape, dim,
  // offset and flat unset); a load by as many ranks gives every rank its own
  // row back, bit for bit.  A load by another number of ranks calls
  // on_resize with every saved row; without a hook it is Error(kMismatch)
  // unless LoadOptions::optional names the tensor (then it keeps its value,
  // with a logged warning).  docs/checkpoint.md, "What survives a size
  // change".
  bool per_rank = false;
  // Writes `dst` from the saved rows (on the loading thread, after every
  // rank verified the checkpoint).  It may throw; the load then fails on
  // every rank.
  std::function<void(const PerRankResize&)> on_resize;

  bool sharded() const { return dim >= 0 || flat || per_rank; }
};

struct NamedTensor {
  std::string name;  // unique within a checkpoint, e.g. "model/fc1.weight"
  Tensor tensor;     // a view into the owner's memory
  ShardInfo shard;
};

using StateDict = std::vector<NamedTensor>;

// Implemented by components whose state a checkpoint carries.
class TUTTI_API Stateful {
 public:
  virtual ~Stateful();
  // Views of the state.  The set of names and shapes must not change between
  // a save and the matching load (allocate lazily-created state up front).
  virtual StateDict state_dict() = 0;
  // Called after a load wrote into the tensors state_dict() returned.
  virtual void on_state_loaded() {}
};

}  // namespace tutti
