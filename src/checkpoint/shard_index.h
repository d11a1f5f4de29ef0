// tutti's facts about one shard file, kept in the safetensors __metadata__
// map (whose values must be strings):
//   "tutti.format"        "1"
//   "tutti.step"          "20"
//   "tutti.rank"          "1"       the writer's rank in its group
//   "tutti.world_size"    "4"
//   "tutti.tensor.<name>" a JSON text: {"xxh64": "<16 hex>",
//                         "global_shape": [8, 4], "dim": 0, "offset": 2,
//                         "flat": false, "group": "tp"}
// A safetensors reader that knows nothing of tutti still opens the file; a
// Python user recovers the extras with json.loads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/shard_geometry.h"

namespace tutti {
namespace ckpt {

struct StoredTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Placement placement;
  std::string group;
  uint64_t xxh64 = 0;
  uint64_t begin = 0;  // offsets into the data region
  uint64_t end = 0;
};

struct ShardIndex {
  std::string path;
  int rank = 0;
  int world_size = 0;
  int64_t step = 0;
  uint64_t data_start = 0;  // absolute offset of the data region
  uint64_t file_bytes = 0;
  std::vector<StoredTensor> tensors;  // in file order
};

std::map<std::string, std::string> encode_shard_metadata(
    int rank, int world_size, int64_t step, const std::vector<StoredTensor>& tensors);

// Validates the tutti extras of a parsed header (every tensor described,
// nothing else described, placements consistent).  kCorrupt naming `path`.
ShardIndex decode_shard(const StHeader& header, const std::string& path,
                        uint64_t file_bytes);

// Reads and validates the header of a shard file; the header bytes (length
// prefix included) are returned through header_bytes for checksumming.
ShardIndex read_shard_index(const std::string& path, std::string* header_bytes);

}  // namespace ckpt
}  // namespace tutti
