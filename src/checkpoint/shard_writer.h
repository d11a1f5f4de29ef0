// Writes one rank's snapshot as a safetensors shard, durably and atomically:
// <dir>/.rank-RRRRR.safetensors.tmp is written, fsynced, renamed to
// rank-RRRRR.safetensors, and the directory is fsynced.  A failure at any
// point removes the temp file and throws; the final name then never exists.
//
// With direct_io the header is padded so the data starts 4 KiB-aligned and
// the data's whole blocks go to the device with O_DIRECT from the (aligned)
// snapshot buffer: no second copy in the page cache, no dirty-page
// throttling when a notice leaves seconds to write gigabytes.  The header
// and the last partial block are written through the page cache.  File
// systems without direct I/O fall back to buffered writes.  Either way the
// bytes are the same apart from the header padding, and fsync decides
// durability.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/file_util.h"
#include "checkpoint/shard_index.h"
#include "checkpoint/snapshot.h"

namespace tutti {
namespace ckpt {

struct ShardWriteResult {
  bool written = false;       // false: nothing to write, no file (kOnce)
  uint64_t bytes = 0;         // file size
  uint64_t header_xxh64 = 0;  // over the length prefix and JSON header
  uint64_t tensors = 0;
  uint64_t data_bytes = 0;
  bool direct = false;        // O_DIRECT carried the data
  std::vector<StoredTensor> stored;  // what the header says, in file order
};

// `skip_empty`: a snapshot without tensors writes no file (the once layout;
// the per-rank layout writes a header-only shard for every rank).
ShardWriteResult write_shard(const std::string& dir, const Snapshot& snap,
                             int rank, int world_size, int64_t step,
                             bool direct_io = true, unsigned file_mode = kFileMode,
                             bool skip_empty = false);

}  // namespace ckpt
}  // namespace tutti
