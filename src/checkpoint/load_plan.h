// Opening a checkpoint (manifest + every shard header, checked against each
// other) and planning which stored bytes land in which destination tensor.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/shard_geometry.h"
#include "checkpoint/shard_index.h"
#include "tutti/checkpoint.h"

namespace tutti {
namespace ckpt {

// Not copyable: `pieces` points into `shards` (moving keeps the addresses).
struct OpenedCheckpoint {
  OpenedCheckpoint() = default;
  OpenedCheckpoint(OpenedCheckpoint&&) = default;
  OpenedCheckpoint& operator=(OpenedCheckpoint&&) = default;
  OpenedCheckpoint(const OpenedCheckpoint&) = delete;
  OpenedCheckpoint& operator=(const OpenedCheckpoint&) = delete;

  std::string dir;
  Manifest manifest;
  std::vector<ShardIndex> shards;  // index == writer rank
  // tensor name -> (shard, stored piece), in shard order
  std::map<std::string, std::vector<std::pair<int, const StoredTensor*>>> pieces;
};

// Reads dir/manifest.json and every shard's header; checks each shard's
// size, header checksum and tensor count against the manifest, and the
// pieces of each tensor against each other (dtype, global shape).  Does not
// read tensor data.  kCorrupt (or kIo / kNotFound for missing files).
OpenedCheckpoint open_checkpoint(const std::string& dir);

struct PieceCopies {
  int shard = 0;
  const StoredTensor* piece = nullptr;
  std::vector<CopyRange> copies;
  // The copies read the whole piece into host memory (a resized per-rank
  // row): execute_plan checks its checksum there, so its shard need not be
  // verified in full (a resize would otherwise read every shard on every
  // rank).
  bool check_in_place = false;
};

struct PlanItem {
  size_t dst = 0;  // index into the destination StateDict
  int resized = -1;  // >= 0: read into LoadPlan::resized[resized].rows instead
  std::vector<PieceCopies> sources;
};

// A per-rank tensor (ShardInfo::per_rank) saved by another number of ranks:
// every saved row is read into host memory, then handed to the tensor's
// on_resize hook (apply_resized).
struct ResizedRows {
  size_t dst = 0;                    // index into the destination StateDict
  std::vector<unsigned char> bytes;  // [saved world, ...local shape]
  Tensor rows;                       // a host view of `bytes`
};

struct LoadPlan {
  std::vector<PlanItem> items;
  std::vector<ResizedRows> resized;
  std::set<int> shards_read;
  std::vector<std::string> skipped;  // optional tensors left unchanged
  size_t unused = 0;                 // stored tensors nobody asked for
};

// Plans the load of `dst` on rank `rank` (per-rank tensors already in their
// stored form, per_rank_as_stored).  A destination tensor that is not in
// the checkpoint, or is stored with another dtype or global shape, is
// Error(kMismatch) unless LoadOptions::optional names it -- except a
// per-rank tensor with an on_resize hook whose saved rows differ only in
// number (the checkpoint's world size): its rows are planned into
// LoadPlan::resized.  Pieces
// are taken starting at shard (rank mod shards), so ranks spread their reads
// of replicated tensors over the shards.
LoadPlan plan_load(const OpenedCheckpoint& ckpt, const StateDict& dst,
                   const LoadOptions& options, int rank);

// Calls the on_resize hook of every per-rank tensor in plan.resized, after
// execute_plan() filled the rows.  `dst`: the state as the owners gave it
// (before per_rank_as_stored).
void apply_resized(const LoadPlan& plan, const StateDict& dst, int saved_world,
                   int world, int rank);

bool is_optional(const std::string& name, const LoadOptions& options);

}  // namespace ckpt
}  // namespace tutti
