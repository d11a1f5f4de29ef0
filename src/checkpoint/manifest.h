// manifest.json: the commit record of one checkpoint.  Its presence (after
// the atomic rename) is what makes a checkpoint directory complete; rank 0
// writes it only after every rank reported a durable shard.
//
//   {"format": "tutti-checkpoint", "version": 3, "name": "step-00000020",
//    "step": 20, "parent": "step-00000010", "world_size": 2, "mesh": {...},
//    "created": "...Z",
//    "shards": [{"rank": 0, "file": "rank-00000.safetensors", "bytes": 4242,
//                "header_xxh64": "<16 hex>", "tensors": 7,
//                "data_bytes": 4096}, ...],
//    "components": ["model", "optimizer", ...],
//    "metadata": {... the caller's non-tensor state: RNG, data position ...},
//    "layout": "once", "tensors": {... manifest_index.h ...},
//    "manifest_xxh64": "<16 hex>"}
//
// manifest_xxh64 is XXH64 of the canonical dump of everything else (see
// manifest.cc): the RNG state, data position and hyperparameters in the
// metadata are verified like the shards.  Version 3 (the once layout) lists
// only the ranks that wrote a shard and adds the tensor index; version 2
// (the per-rank layout, still written on request) lists one shard per rank
// and no index; version 1 (no checksum, no parent) is still read.
//
// "parent" names the checkpoint whose state this one continues (the one
// the job loaded, or its previous save; "" after a fresh start): the chain
// of parents is the job's timeline, the only checkpoints retention counts
// and removes.  Manifests without it (older tutti) have no parent.
//
// A shard's header_xxh64 covers its 8-byte length prefix and JSON header,
// and the header holds the xxHash64 of every tensor's bytes: together they
// cover every byte of the shard (a Merkle-style chain), so the loader
// verifies a shard in one pass over its data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/manifest_index.h"

namespace tutti {
namespace ckpt {

struct ShardRecord {
  int rank = 0;
  std::string file;
  uint64_t bytes = 0;
  uint64_t header_xxh64 = 0;
  uint64_t tensors = 0;
  uint64_t data_bytes = 0;
};

struct Manifest {
  std::string name;
  int64_t step = 0;
  std::string parent;  // "" for the first checkpoint of a timeline
  int world_size = 0;
  nlohmann::json mesh = nlohmann::json::object();
  std::string created;
  // Version 1 and 2: one per rank, index == rank.  Version 3: the ranks
  // that wrote a shard, by rank.
  std::vector<ShardRecord> shards;
  std::vector<std::string> components;
  nlohmann::json metadata = nlohmann::json::object();
  int64_t version = 0;   // as parsed (manifest_to_json writes 3 or 2)
  bool indexed = false;  // version 3: `tensors` holds every piece
  TensorIndex tensors;
};

std::string shard_file_name(int rank);
std::string manifest_to_json(const Manifest& m);
// Writes version 3 when m.indexed, else version 2.
// Validates structure and consistency (shards in rank order, one per rank
// up to version 2; file names tutti would write: no path separators; the
// index against the shards).  kCorrupt naming `path`.
Manifest parse_manifest(const std::string& text, const std::string& path);
// Reads and parses <dir>/manifest.json (at most TUTTI_CKPT_MAX_HEADER_MB).
Manifest read_manifest(const std::string& dir);

// Parses the caller's metadata argument: a JSON object ("" means {}).
// kInvalidArgument otherwise.
nlohmann::json parse_user_metadata(const std::string& text);

}  // namespace ckpt
}  // namespace tutti
