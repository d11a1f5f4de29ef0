// Writes one rank's snapshot as a safetensors shard, durably and atomically:
// <dir>/.rank-RRRRR.safetensors.tmp is written, fsynced, renamed to
// rank-RRRRR.safetensors, and the directory is fsynced.  A failure at any
// point removes the temp file and throws; the final name then never exists.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/snapshot.h"

namespace tutti {
namespace ckpt {

struct ShardWriteResult {
  uint64_t bytes = 0;         // file size
  uint64_t header_xxh64 = 0;  // over the length prefix and JSON header
  uint64_t tensors = 0;
  uint64_t data_bytes = 0;
};

ShardWriteResult write_shard(const std::string& dir, const Snapshot& snap,
                             int rank, int world_size, int64_t step);

}  // namespace ckpt
}  // namespace tutti
