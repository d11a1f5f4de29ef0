#include "checkpoint/manifest.h"

#include <cstdio>

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
            {"version", 1},
            {"name", m.name},
            {"step", m.step},
            {"parent", m.parent},
            {"world_size", m.world_size},
            {"mesh", m.mesh},
            {"created", m.created},
            {"shards", shards},
            {"components", m.components},
            {"metadata", m.metadata}};
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  const json j = parse_untrusted_json(text, kMaxDepth, path);
  if (json_string(j, "format", path) != "tutti-checkpoint")
    TUTTI_THROW(kCorrupt, "'", path, "' is not a tutti checkpoint manifest");
  if (json_int(j, "version", path) != 1)
    TUTTI_THROW(kCorrupt, "'", path, "': manifest version ", j["version"].dump(),
                " is not supported (this build reads version 1)");
  Manifest m;
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
  if (!shards.is_array() || shards.size() != static_cast<size_t>(m.world_size))
    TUTTI_THROW(kCorrupt, "'", path, "': expected ", m.world_size,
                " shards (one per rank), found ",
                shards.is_array() ? std::to_string(shards.size()) : shards.type_name());
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string what = path + "' shard " + std::to_string(i);
    ShardRecord s;
    const int64_t rank = json_int(shards[i], "rank", what);
    if (rank != static_cast<int64_t>(i))
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
