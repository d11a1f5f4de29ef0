#include "checkpoint/shard_index.h"

#include <nlohmann/json.hpp>

#include "checkpoint/file_util.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;
const char kTensorPrefix[] = "tutti.tensor.";

int64_t meta_int(const std::map<std::string, std::string>& m, const char* key,
                 const std::string& path) {
  auto it = m.find(key);
  if (it == m.end())
    TUTTI_THROW(kCorrupt, "'", path, "': __metadata__ lacks '", key,
                "' (not a tutti checkpoint shard?)");
  const json v = parse_untrusted_json(it->second, 1, path + "' metadata '" + key);
  if (!v.is_number_integer())
    TUTTI_THROW(kCorrupt, "'", path, "': __metadata__ '", key, "' = '", it->second,
                "' is not an integer");
  return v.get<int64_t>();
}

}  // namespace

std::map<std::string, std::string> encode_shard_metadata(
    int rank, int world_size, int64_t step, const std::vector<StoredTensor>& tensors) {
  std::map<std::string, std::string> m;
  m["tutti.format"] = "1";
  m["tutti.step"] = std::to_string(step);
  m["tutti.rank"] = std::to_string(rank);
  m["tutti.world_size"] = std::to_string(world_size);
  for (const auto& t : tensors) {
    const Placement& p = t.placement;
    json j = {{"xxh64", hex64(t.xxh64)},
              {"global_shape", p.global_shape},
              {"dim", p.dim},
              {"offset", p.offset},
              {"flat", p.flat},
              {"group", t.group}};
    m[kTensorPrefix + t.name] = j.dump();
  }
  return m;
}

ShardIndex decode_shard(const StHeader& header, const std::string& path,
                        uint64_t file_bytes) {
  ShardIndex s;
  s.path = path;
  s.file_bytes = file_bytes;
  s.data_start = header.data_start();
  const auto& m = header.metadata;
  if (meta_int(m, "tutti.format", path) != 1)
    TUTTI_THROW(kCorrupt, "'", path, "': unknown tutti.format '",
                m.at("tutti.format"), "' (this build reads format 1)");
  s.step = meta_int(m, "tutti.step", path);
  const int64_t rank = meta_int(m, "tutti.rank", path);
  const int64_t world = meta_int(m, "tutti.world_size", path);
  if (world < 1 || world > (1 << 24) || rank < 0 || rank >= world)
    TUTTI_THROW(kCorrupt, "'", path, "': rank ", rank, " of world size ", world,
                " is impossible");
  s.rank = static_cast<int>(rank);
  s.world_size = static_cast<int>(world);
  size_t described = 0;
  for (const auto& kv : m)
    if (kv.first.compare(0, sizeof(kTensorPrefix) - 1, kTensorPrefix) == 0) ++described;
  if (described != header.entries.size())
    TUTTI_THROW(kCorrupt, "'", path, "': __metadata__ describes ", described,
                " tensors but the header holds ", header.entries.size());
  for (const auto& e : header.entries) {
    const std::string what = path + "': tensor '" + e.name;
    auto it = m.find(kTensorPrefix + e.name);
    if (it == m.end())
      TUTTI_THROW(kCorrupt, "'", what, "' has no tutti metadata");
    const json j = parse_untrusted_json(it->second, 2, what);
    ShardInfo info;
    const json& gs = json_field(j, "global_shape", what);
    if (!gs.is_array() || gs.size() > static_cast<size_t>(Shape::kMaxDims))
      TUTTI_THROW(kCorrupt, "'", what, "': global_shape ", gs.dump(),
                  " is not an array of at most ", Shape::kMaxDims, " integers");
    for (const auto& d : gs) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        TUTTI_THROW(kCorrupt, "'", what, "': global_shape ", gs.dump(),
                    " holds a value that is not a non-negative integer");
      info.global_shape.push_back(d.get<int64_t>());
    }
    const int64_t dim = json_int(j, "dim", what);
    if (dim < -1 || dim >= Shape::kMaxDims)
      TUTTI_THROW(kCorrupt, "'", what, "': dim ", dim, " is out of range");
    info.dim = static_cast<int>(dim);
    info.offset = json_int(j, "offset", what);
    info.flat = json_bool(j, "flat", what);
    StoredTensor t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.group = json_string(j, "group", what);
    t.xxh64 = parse_hex64(json_string(j, "xxh64", what), what);
    t.placement = make_placement(e.shape, info, ErrorCode::kCorrupt, what);
    t.begin = e.begin;
    t.end = e.end;
    s.tensors.push_back(std::move(t));
  }
  return s;
}

ShardIndex read_shard_index(const std::string& path, std::string* header_bytes) {
  File f = File::open_read(path);
  const uint64_t size = f.size();
  unsigned char prefix[8] = {};
  if (size >= 8) f.pread_all(prefix, 8, 0);
  const uint64_t n = parse_header_length(prefix, size, max_header_bytes(), path);
  std::string buf(8 + static_cast<size_t>(n), '\0');
  f.pread_all(&buf[0], buf.size(), 0);
  const StHeader h = parse_header_json(buf.data() + 8, static_cast<size_t>(n), n,
                                       size - 8 - n, path);
  ShardIndex idx = decode_shard(h, path, size);
  if (header_bytes) *header_bytes = std::move(buf);
  return idx;
}

}  // namespace ckpt
}  // namespace tutti
