// The memory tier across hosts (issue 28; docs/checkpoint.md, "Memory
// tier"): which rank keeps whose copies, and which files a restore moves
// where.  Pure functions of small vectors every rank computes alike, so
// that no rank needs another's decision (memory_replica.h runs them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {
namespace ckpt {

// The job's ranks grouped by host.  Host order is the order of each
// host's lowest rank (the node split's), ranks ascending within a host.
struct NodeLayout {
  std::vector<int> node_of;               // per rank: its host's index
  std::vector<std::vector<int>> members;  // per host: its ranks, ascending
  int nodes() const { return static_cast<int>(members.size()); }
  int leader(int node) const { return members[static_cast<size_t>(node)][0]; }
  int local_index(int rank) const;
};

// From one key per rank that is equal exactly for ranks on the same host
// (e.g. the world rank of the host's lowest rank).
NodeLayout layout_from_keys(const std::vector<int64_t>& keys);

// The rank that keeps `rank`'s buddy copies: the rank with the same local
// index on the next host (wrapping; modulo that host's size when it has
// fewer ranks).  -1 with one host.
int buddy_of(const NodeLayout& layout, int rank);
// The ranks whose buddy is `rank`, ascending (several when hosts differ in
// size).
std::vector<int> buddy_senders(const NodeLayout& layout, int rank);

// One whole file sent by a restore: file index `file` (the manifest's
// shard order) from rank `from` (which holds it) to rank `to` (the leader
// of a host that lacks it).
struct FileTransfer {
  int file = 0;
  int from = 0;
  int to = 0;
  bool operator==(const FileTransfer& o) const {
    return file == o.file && from == o.from && to == o.to;
  }
};

// Words per file of a host bitmap.
inline int bitmap_words(int nodes) { return (nodes + 63) / 64; }

// holder[f]: the lowest rank holding file f (own or buddy copy), -1 when
// none does.  lacking[f * bitmap_words(nodes) + n / 64] has bit n % 64 set
// when host n lacks file f.  Returns the transfers, ordered by file then
// host: each lacking host's leader receives the file from its holder.
// Files without a holder are skipped (the caller refused such a step).
std::vector<FileTransfer> plan_transfers(const NodeLayout& layout,
                                         const std::vector<int>& holder,
                                         const std::vector<int64_t>& lacking);

// "1, 4-6, 9" for sorted distinct ranks.
std::string rank_ranges(const std::vector<int>& ranks);

}  // namespace ckpt
}  // namespace tutti
