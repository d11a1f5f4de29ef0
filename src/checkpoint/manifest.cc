#include "checkpoint/manifest.h"

#include <cstdio>

#include <xxhash.h>

#include "checkpoint/catalog.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;
constexpr int kMaxDepth = 64;  // user metadata may nest; bounded all the same
constexpr int64_t kVersion = 3;  // 2: manifest_xxh64 and parent; 3: the index
constexpr int64_t kPerRankVersion = 2;  // what the per-rank layout writes
constexpr const char* kChecksumKey = "manifest_xxh64";

// The checksum covers the manifest's meaning, not its bytes: XXH64 of the
// canonical dump (sorted keys, as written) of everything but the checksum
// itself.  Any bit flip either breaks the JSON or changes a value, a key or
// a string, and with it the canonical dump.
uint64_t body_xxh64(const json& body) {
  const std::string text = body.dump(1);
  return XXH64(text.data(), text.size(), 0);
}

}  // namespace

std::string shard_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

std::string manifest_to_json(const Manifest& m) {
  json shards = json::array();
  for (const auto& s : m.shards)
    shards.push_back({{"rank", s.rank},
                      {"file", s.file},
                      {"bytes", s.bytes},
                      {"header_xxh64", hex64(s.header_xxh64)},
                      {"tensors", s.tensors},
                      {"data_bytes", s.data_bytes}});
  json j = {{"format", "tutti-checkpoint"},
            {"version", m.indexed ? kVersion : kPerRankVersion},
            {"name", m.name},
            {"step", m.step},
            {"parent", m.parent},
            {"world_size", m.world_size},
            {"mesh", m.mesh},
            {"created", m.created},
            {"shards", shards},
            {"components", m.components},
            {"metadata", m.metadata}};
  if (m.indexed) {
    j["layout"] = "once";
    j["tensors"] = index_to_json(m.tensors);
  }
  j[kChecksumKey] = hex64(body_xxh64(j));
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  const json j = parse_untrusted_json(text, kMaxDepth, path);
  if (json_string(j, "format", path) != "tutti-checkpoint")
    TUTTI_THROW(kCorrupt, "'", path, "' is not a tutti checkpoint manifest");
  const int64_t version = json_int(j, "version", path);
  if (version < 1 || version > kVersion)
    TUTTI_THROW(kCorrupt, "'", path, "': manifest version ", j["version"].dump(),
                " is not supported (this build reads versions 1 to ", kVersion, ")");
  if (version >= 2) {
    // Version 1 (older tutti) had no checksum; from 2 on it is mandatory, so
    // a flip that renames the key cannot switch the check off.
    json body = j;
    body.erase(kChecksumKey);
    const uint64_t want = parse_hex64(json_string(j, kChecksumKey, path), path);
    const uint64_t got = body_xxh64(body);
    if (got != want)
      TUTTI_THROW(kCorrupt, "'", path, "': manifest checksum ", hex64(got),
                  " does not match the stored ", hex64(want),
                  " (the manifest was altered after it was written)");
  }
  Manifest m;
  m.version = version;
  m.indexed = version >= 3;
  m.name = json_string(j, "name", path);
  m.step = json_int(j, "step", path);
  if (j.contains("parent")) {
    m.parent = json_string(j, "parent", path);
    int64_t ps;
    int pf;
    if (!m.parent.empty() && !parse_checkpoint_name(m.parent, &ps, &pf))
      TUTTI_THROW(kCorrupt, "'", path, "': parent '", m.parent,
                  "' is not a checkpoint name");
  }
  const int64_t world = json_int(j, "world_size", path);
  if (m.step < 0 || world < 1 || world > (1 << 24))
    TUTTI_THROW(kCorrupt, "'", path, "': step ", m.step, " / world size ", world,
                " is impossible");
  m.world_size = static_cast<int>(world);
  m.mesh = json_field(j, "mesh", path);
  m.created = json_string(j, "created", path);
  m.metadata = json_field(j, "metadata", path);
  if (!m.metadata.is_object())
    TUTTI_THROW(kCorrupt, "'", path, "': metadata is not a JSON object");
  const json& comps = json_field(j, "components", path);
  if (!comps.is_array())
    TUTTI_THROW(kCorrupt, "'", path, "': components is not an array");
  for (const auto& c : comps) {
    if (!c.is_string())
      TUTTI_THROW(kCorrupt, "'", path, "': components holds a non-string");
    m.components.push_back(c.get<std::string>());
  }
  const json& shards = json_field(j, "shards", path);
  if (!shards.is_array() ||
      (m.indexed ? shards.size() > static_cast<size_t>(m.world_size)
                 : shards.size() != static_cast<size_t>(m.world_size)))
    TUTTI_THROW(kCorrupt, "'", path, "': expected ", m.indexed ? "at most " : "",
                m.world_size, " shards (one per rank), found ",
                shards.is_array() ? std::to_string(shards.size()) : shards.type_name());
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string what = path + "' shard " + std::to_string(i);
    ShardRecord s;
    const int64_t rank = json_int(shards[i], "rank", what);
    // Version 3 lists the writers only, in rank order.
    const bool in_order = m.indexed ? rank >= 0 && rank < m.world_size &&
                                          (m.shards.empty() || rank > m.shards.back().rank)
                                    : rank == static_cast<int64_t>(i);
    if (!in_order)
      TUTTI_THROW(kCorrupt, "'", what, " claims rank ", rank);
    s.rank = static_cast<int>(rank);
    s.file = json_string(shards[i], "file", what);
    if (s.file != shard_file_name(s.rank))
      TUTTI_THROW(kCorrupt, "'", what, " names the file '", s.file,
                  "' (expected '", shard_file_name(s.rank), "')");
    s.bytes = json_uint(shards[i], "bytes", what);
    s.header_xxh64 = parse_hex64(json_string(shards[i], "header_xxh64", what), what);
    s.tensors = json_uint(shards[i], "tensors", what);
    s.data_bytes = json_uint(shards[i], "data_bytes", what);
    m.shards.push_back(s);
  }
  if (m.indexed) {
    if (json_string(j, "layout", path) != "once")
      TUTTI_THROW(kCorrupt, "'", path, "': layout ", j["layout"].dump(),
                  " (version 3 writes \"once\")");
    std::vector<ShardExtent> extents;
    for (const ShardRecord& s : m.shards) extents.push_back({s.rank, s.tensors, s.data_bytes});
    m.tensors = parse_index(json_field(j, "tensors", path), extents, path);
  }
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = join_path(dir, kManifestName);
  return parse_manifest(read_file(path, max_header_bytes()), path);
}

json parse_user_metadata(const std::string& text) {
  if (text.empty()) return json::object();
  json j;
  try {
    j = parse_untrusted_json(text, kMaxDepth, "checkpoint metadata");
  } catch (const Error& e) {
    TUTTI_THROW(kInvalidArgument, "checkpoint metadata is not valid JSON: ",
                e.message());
  }
  TUTTI_ARG_CHECK(j.is_object(), "checkpoint metadata must be a JSON object, got ",
                  j.type_name());
  return j;
}

}  // namespace ckpt
}  // namespace tutti
