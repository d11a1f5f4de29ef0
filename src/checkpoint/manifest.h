// manifest.json: the commit record of one checkpoint.  Its presence (after
// the atomic rename) is what makes a checkpoint directory complete; rank 0
// writes it only after every rank reported a durable shard.
//
//   {"format": "tutti-checkpoint", "version": 2, "name": "step-00000020",
//    "step": 20, "parent": "step-00000010", "world_size": 2, "mesh": {...},
//    "created": "...Z",
//    "shards": [{"rank": 0, "file": "rank-00000.safetensors", "bytes": 4242,
//                "header_xxh64": "<16 hex>", "tensors": 7,
//                "data_bytes": 4096}, ...],
//    "components": ["model", "optimizer", ...],
//    "metadata": {... the caller's non-tensor state: RNG, data position ...},
//    "manifest_xxh64": "<16 hex>"}
//
// manifest_xxh64 is XXH64 of the canonical dump of everything else (see
// manifest.cc): the RNG state, data position and hyperparameters in the
// metadata are verified like the shards.  Version 1 manifests (no checksum,
// no parent) are still read.
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
  std::vector<ShardRecord> shards;  // index == rank
  std::vector<std::string> components;
  nlohmann::json metadata = nlohmann::json::object();
};

std::string shard_file_name(int rank);
std::string manifest_to_json(const Manifest& m);
// Validates structure and consistency (one shard per rank, in order, file
// names tutti would write: no path separators).  kCorrupt naming `path`.
Manifest parse_manifest(const std::string& text, const std::string& path);
// Reads and parses <dir>/manifest.json (at most TUTTI_CKPT_MAX_HEADER_MB).
Manifest read_manifest(const std::string& dir);

// Parses the caller's metadata argument: a JSON object ("" means {}).
// kInvalidArgument otherwise.
nlohmann::json parse_user_metadata(const std::string& text);

}  // namespace ckpt
}  // namespace tutti
