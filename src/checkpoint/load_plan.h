// Opening a checkpoint and planning which stored bytes land in which
// destination tensor.  A version-3 manifest carries the tensor index: the
// plan comes from it alone, and only the shards a rank reads are opened
// (shard_files.h checks each one's header against the index then).  Older
// manifests name only the shards: every shard's header is read.
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
  bool indexed = false;  // planned from the manifest's index (version 3)
  // index == writer rank (manifest world size entries).  Indexed: the
  // pieces come from the index, data_start is known once the shard is
  // opened (ShardFiles), and `record_of[s]` is shard s's entry in
  // manifest.shards (-1: rank s wrote no file).
  std::vector<ShardIndex> shards;
  std::vector<int> record_of;
  struct Kind {
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;  // global
  };
  std::map<std::string, Kind> tensors;
  // tensor name -> (shard, stored piece), in shard order
  std::map<std::string, std::vector<std::pair<int, const StoredTensor*>>> pieces;
};

struct ReadStats {
  uint64_t files_opened = 0;
  uint64_t bytes_read = 0;
};

// The checkpoint in `dir` described by `manifest` (parsed from
// dir/manifest.json).  Indexed: no file is opened.  Otherwise every shard's
// header is read and checked (size, header checksum and tensor count
// against the manifest; the pieces of each tensor against each other:
// dtype, global shape).  Does not read tensor data.  kCorrupt (or kIo /
// kNotFound for missing files).
OpenedCheckpoint open_checkpoint(const std::string& dir, Manifest manifest, ReadStats* stats);
// Reads and parses dir/manifest.json, then open_checkpoint().
OpenedCheckpoint open_checkpoint(const std::string& dir, ReadStats* stats);

struct PieceCopies {
  int shard = 0;
  const StoredTensor* piece = nullptr;
  std::vector<CopyRange> copies;
  // The copies read the whole piece into host memory (a resized per-rank
  // row): execute_plan checks its checksum there, so its shard need not be
  // verified in full (a resize would otherwise read every shard on every
  // rank).
  bool check_in_place = false;
  // >= 0: replicated state read once per node: the rank of the node group
  // that reads it for every rank of the node (node_share.h).  -1: this rank
  // reads it.
  int reader = -1;
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
