// Who writes which bytes of a save in the "once" layout
// (CheckpointLayout::kOnce, docs/checkpoint.md "Layouts").
//
// Every rank describes its state as a *catalog*: the sorted list of its
// replicated tensors and of its tensors split evenly along a dimension
// (name, dtype, global shape, dim, parts P = global extent / local extent;
// P = 0 for an uneven split).  Two all-reduces (MAX) decide the layout:
//   1. [invalid, F, ~F, n, ~n]: F fingerprints the catalog and the layout
//      settings, n is the length of the second vector.  MAX(x) == ~MAX(~x)
//      holds iff every rank contributed the same x, so this agrees that the
//      catalogs are identical, which makes "slot" (tensor j, part p) a
//      global index.  Catalogs that differ: every rank writes everything it
//      holds (the per-rank layout) for this save, with one warning.
//   2. per replicated tensor [h, ~h], per part of an evenly split tensor
//      [h, ~h, elect]: h is a digest of the holder's bytes (non-holders
//      contribute INT64_MIN, the identity of MAX), elect is ~key with key =
//      (a hash of the slot) << 24 | rank, so MAX names the holder with the
//      smallest key: a pseudo-random, stable writer among the holders.
// The rules, which never drop data (duplicates are their only failure mode):
//   * replicated tensors whose copies agree are laid end to end in catalog
//     order and cut into max(1, min(W, T / chunk)) ranges of ~equal bytes
//     (element boundaries), range k written by rank k * W / ranges: small
//     states land on rank 0, large ones on every rank (empty ones on rank 0,
//     so that every tensor lies in some shard);
//   * a part of an evenly split tensor whose holders agree: its elected
//     holder writes it whole;
//   * copies that differ (rank-distinct data declared replicated), uneven
//     splits, flat (ZeRO) and per-rank pieces: every holder writes its own
//     (an empty piece of a non-empty tensor is skipped).
// Rank 0 checks at commit that the written pieces cover every tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/shard_geometry.h"
#include "tutti/checkpoint.h"
#include "tutti/state.h"

namespace tutti {
namespace ckpt {

// A contiguous range of a local tensor this rank writes, and where the
// stored piece sits in the global tensor.
struct WriteItem {
  size_t src = 0;        // index into the StateDict
  uint64_t first = 0;    // first element of the (flattened) local tensor
  uint64_t count = 0;    // elements
  Placement placement;   // of the stored piece
};

// How save() checks that replicas agree (TUTTI_CKPT_VERIFY_REPLICAS).
enum class ReplicaCheck {
  kSample,  // host tensors hashed whole; CUDA tensors: numel and 16 blocks
            // of 64 bytes (a copy of a few KiB instead of the tensor)
  kFull,    // CUDA tensors copied to host and hashed whole too
};

struct ElectionConfig {
  bool once = true;             // false: the per-rank layout
  uint64_t chunk_bytes = 16ull << 20;
  ReplicaCheck check = ReplicaCheck::kSample;
};

// One catalog entry (see above).
struct SlotEntry {
  size_t src = 0;       // index into the StateDict
  int64_t parts = 1;    // 1: replicated, or P parts along dim; 0: uneven
  int64_t part = 0;     // this rank's part
};

class Election {
 public:
  // `state` after per_rank_as_stored, `placements` as describe_state made
  // them.  Local: builds the catalog.  Throws nothing for a valid state.
  Election(const StateDict& state, const std::vector<Placement>& placements,
           const ElectionConfig& cfg, int rank, int world);

  // The first all-reduce's words, then its outcome.
  std::vector<int64_t> catalog_words(bool invalid) const;
  // false when the catalogs or settings differ (per-rank layout this save).
  bool catalogs_agree(const std::vector<int64_t>& reduced) const;

  // Tensors whose digests the second vector needs, in slot order.
  std::vector<size_t> digest_sources() const;
  // The second all-reduce's words from the digests of digest_sources().
  std::vector<int64_t> slot_words(const std::vector<uint64_t>& digests) const;

  // What this rank writes.  `reduced`: the second all-reduce's result, or
  // empty for the per-rank layout (every tensor whole).
  std::vector<WriteItem> decide(const std::vector<int64_t>& reduced);

  // After decide(): replicated tensors (or split pieces) whose holders
  // hold different bytes, each holder having written its own copy.
  const std::vector<std::string>& divergent() const { return divergent_; }
  // Why this save used the per-rank layout ("" when it did not).
  const std::string& fallback() const { return fallback_; }
  void set_fallback(std::string why) { fallback_ = std::move(why); }

 private:
  const StateDict& state_;
  const std::vector<Placement>& placements_;
  ElectionConfig cfg_;
  int rank_, world_;
  std::vector<SlotEntry> catalog_;  // sorted by name
  uint64_t fingerprint_ = 0;
  size_t words_ = 0;
  std::vector<std::string> divergent_;
  std::string fallback_;
};

// One cut of the replicated stream: `count` elements from `first` of
// tensor `tensor`, written by `writer`.
struct StreamCut {
  size_t tensor = 0;
  int writer = 0;
  uint64_t first = 0;
  uint64_t count = 0;
};
// The cuts of tensors of bytes[i] bytes with element size elem[i], laid end
// to end (rules above).  Pure: the unit tests check it directly.
std::vector<StreamCut> cut_stream(const std::vector<uint64_t>& bytes,
                                  const std::vector<uint64_t>& elem, int world,
                                  uint64_t chunk_bytes);

// The elected holder's key for slot (name, part) of `rank` (smallest wins).
int64_t election_key(const std::string& name, int64_t part, int rank);

// The settings: TUTTI_CKPT_LAYOUT (or `requested`), TUTTI_CKPT_CHUNK_MB,
// TUTTI_CKPT_VERIFY_REPLICAS.  kInvalidArgument for unknown values.
ElectionConfig election_config(CheckpointLayout requested);

}  // namespace ckpt
}  // namespace tutti
