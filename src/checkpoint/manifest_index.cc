#include "checkpoint/manifest_index.h"

#include <algorithm>
#include <set>

#include "checkpoint/safetensors.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

std::string tensor_desc(DType dtype, const std::vector<int64_t>& shape) {
  return std::string(dtype_safetensors_name(dtype)) + shape_str(shape);
}

json placement_json(const Placement& p) {
  if (p.flat) return {{"flat", p.offset}};
  if (p.dim < 0) return nullptr;
  return {{"dim", p.dim},
          {"offset", p.offset},
          {"extent", p.local_shape[static_cast<size_t>(p.dim)]}};
}

uint64_t elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Sorted, merged union of [b, e) intervals: the elements not in it within
// [0, n).
uint64_t gaps(std::vector<std::pair<uint64_t, uint64_t>> iv, uint64_t n, uint64_t* first) {
  std::sort(iv.begin(), iv.end());
  uint64_t cur = 0, missing = 0;
  *first = n;
  for (const auto& x : iv) {
    if (x.first > cur) {
      if (*first == n) *first = cur;
      missing += std::min(x.first, n) - cur;
    }
    cur = std::max(cur, x.second);
    if (cur >= n) break;
  }
  if (cur < n) {
    if (*first == n) *first = cur;
    missing += n - cur;
  }
  return missing;
}

int64_t as_int(const json& v, const std::string& what) {
  if (!v.is_number_integer())
    TUTTI_THROW(kCorrupt, "'", what, "' holds ", v.dump(), " (expected an integer)");
  return v.get<int64_t>();
}

uint64_t as_uint(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const int64_t x = as_int(v, what);
  if (x < 0) TUTTI_THROW(kCorrupt, "'", what, "' holds ", v.dump(), " (expected >= 0)");
  return static_cast<uint64_t>(x);
}

// The placement of a piece of `t` from its JSON and its byte length.
Placement parse_placement(const json& j, const IndexTensor& t, uint64_t bytes,
                          const std::string& what) {
  const uint64_t es = dtype_size(t.dtype);
  if (bytes % es != 0)
    TUTTI_THROW(kCorrupt, "'", what, "' spans ", bytes, " bytes, not a multiple of ",
                dtype_safetensors_name(t.dtype), "'s ", es);
  const uint64_t n = bytes / es;
  ShardInfo info;
  info.global_shape = t.shape;
  std::vector<int64_t> local = t.shape;
  if (j.is_null()) {
    info.global_shape.clear();
  } else if (j.is_object() && j.size() == 1 && j.contains("flat")) {
    info.flat = true;
    info.offset = as_int(j["flat"], what + " flat");
    local = {static_cast<int64_t>(n)};
  } else if (j.is_object() && j.size() == 3 && j.contains("dim") && j.contains("offset") &&
             j.contains("extent")) {
    const int64_t d = as_int(j["dim"], what + " dim");
    if (d < 0 || d >= static_cast<int64_t>(t.shape.size()))
      TUTTI_THROW(kCorrupt, "'", what, "': dim ", d, " is not a dimension of ",
                  shape_str(t.shape));
    info.dim = static_cast<int>(d);
    info.offset = as_int(j["offset"], what + " offset");
    local[static_cast<size_t>(d)] = as_int(j["extent"], what + " extent");
  } else {
    TUTTI_THROW(kCorrupt, "'", what, "': placement ", j.dump(),
                " (expected null, {\"flat\": o} or {\"dim\", \"offset\", \"extent\"})");
  }
  Placement p = make_placement(local, info, ErrorCode::kCorrupt, what);
  if (checked_numel(p.local_shape, what) != n)
    TUTTI_THROW(kCorrupt, "'", what, "' spans ", bytes, " bytes but its placement ",
                j.dump(), " holds ", checked_numel(p.local_shape, what), " elements of ",
                tensor_desc(t.dtype, t.shape));
  return p;
}

}  // namespace

void declare_tensor(TensorIndex* index, const std::string& name, DType dtype,
                    const std::vector<int64_t>& shape, int rank) {
  auto it = index->find(name);
  if (it == index->end()) {
    IndexTensor t;
    t.dtype = dtype;
    t.shape = shape;
    index->emplace(name, std::move(t));
    return;
  }
  if (it->second.dtype != dtype || it->second.shape != shape)
    TUTTI_THROW(kInvalidArgument, "tensor '", name, "' is ", tensor_desc(dtype, shape),
                " on rank ", rank, " but ",
                tensor_desc(it->second.dtype, it->second.shape),
                " on another rank (every rank must describe a tensor alike)");
}

void add_piece(TensorIndex* index, int shard, const StoredTensor& s) {
  declare_tensor(index, s.name, s.dtype, s.placement.global_shape, shard);
  IndexPiece p;
  p.shard = shard;
  p.begin = s.begin;
  p.end = s.end;
  p.xxh64 = s.xxh64;
  p.placement = s.placement;
  (*index)[s.name].pieces.push_back(std::move(p));
}

void finish_index(TensorIndex* index) {
  for (auto& kv : *index) {
    std::sort(kv.second.pieces.begin(), kv.second.pieces.end(),
              [](const IndexPiece& a, const IndexPiece& b) {
                return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
              });
    uint64_t first = 0;
    const uint64_t missing = uncovered_elements(kv.second, &first);
    if (missing > 0)
      TUTTI_THROW(kInvalidArgument, "tensor '", kv.first, "' ",
                  tensor_desc(kv.second.dtype, kv.second.shape), ": ", missing,
                  " elements (the first at flat index ", first,
                  ") were written by no rank; its pieces do not cover it (do the "
                  "ranks' ShardInfo offsets and global shapes fit together?)");
  }
}

json index_to_json(const TensorIndex& index) {
  json out = json::object();
  for (const auto& kv : index) {
    json pieces = json::array();
    for (const IndexPiece& p : kv.second.pieces)
      pieces.push_back({p.shard, p.begin, p.end, hex64(p.xxh64), placement_json(p.placement)});
    out[kv.first] = {{"dtype", dtype_safetensors_name(kv.second.dtype)},
                     {"shape", kv.second.shape},
                     {"pieces", pieces}};
  }
  return out;
}

TensorIndex parse_index(const json& tensors, const std::vector<ShardExtent>& shards,
                        const std::string& path) {
  if (!tensors.is_object())
    TUTTI_THROW(kCorrupt, "'", path, "': tensors is not a JSON object");
  std::map<int, const ShardExtent*> by_rank;
  for (const ShardExtent& s : shards) by_rank[s.rank] = &s;
  // Per shard: (begin, end, name) of its pieces, to check their tiling.
  std::map<int, std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>>> tiles;
  TensorIndex index;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string what = path + "' tensor '" + it.key();
    if (it.key().empty()) TUTTI_THROW(kCorrupt, "'", path, "': a tensor has an empty name");
    IndexTensor t;
    if (!dtype_from_safetensors(json_string(*it, "dtype", what), &t.dtype))
      TUTTI_THROW(kCorrupt, "'", what, "': unknown dtype ", (*it)["dtype"].dump());
    const json& shape = json_field(*it, "shape", what);
    if (!shape.is_array() || shape.size() > static_cast<size_t>(Shape::kMaxDims))
      TUTTI_THROW(kCorrupt, "'", what, "': shape ", shape.dump(), " is not an array of at most ",
                  Shape::kMaxDims, " integers");
    for (const json& d : shape) {
      const int64_t x = as_int(d, what + "' shape");
      if (x < 0) TUTTI_THROW(kCorrupt, "'", what, "': negative dimension ", x);
      t.shape.push_back(x);
    }
    checked_numel(t.shape, what);
    const json& pieces = json_field(*it, "pieces", what);
    if (!pieces.is_array()) TUTTI_THROW(kCorrupt, "'", what, "': pieces is not an array");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const json& pj = pieces[k];
      const std::string pw = what + "' piece " + std::to_string(k);
      if (!pj.is_array() || pj.size() != 5)
        TUTTI_THROW(kCorrupt, "'", pw, "' is ", pj.dump(),
                    " (expected [shard, begin, end, xxh64, placement])");
      IndexPiece p;
      const int64_t shard = as_int(pj[0], pw + " shard");
      auto rec = by_rank.find(static_cast<int>(std::clamp<int64_t>(shard, -1, INT32_MAX)));
      if (shard < 0 || shard > INT32_MAX || rec == by_rank.end())
        TUTTI_THROW(kCorrupt, "'", pw, "' lies in shard ", shard,
                    ", which the manifest does not list");
      p.shard = static_cast<int>(shard);
      p.begin = as_uint(pj[1], pw + " begin");
      p.end = as_uint(pj[2], pw + " end");
      if (p.end < p.begin || p.end > rec->second->data_bytes)
        TUTTI_THROW(kCorrupt, "'", pw, "' spans bytes [", p.begin, ", ", p.end,
                    ") of a shard holding ", rec->second->data_bytes);
      if (!pj[3].is_string())
        TUTTI_THROW(kCorrupt, "'", pw, "': xxh64 ", pj[3].dump(), " is not a string");
      p.xxh64 = parse_hex64(pj[3].get<std::string>(), pw);
      p.placement = parse_placement(pj[4], t, p.end - p.begin, pw);
      tiles[p.shard].push_back({{p.begin, p.end}, it.key()});
      t.pieces.push_back(std::move(p));
    }
    std::sort(t.pieces.begin(), t.pieces.end(), [](const IndexPiece& a, const IndexPiece& b) {
      return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
    });
    uint64_t first = 0;
    const uint64_t missing = uncovered_elements(t, &first);
    if (missing > 0)
      TUTTI_THROW(kCorrupt, "'", what, "': its pieces leave ", missing,
                  " elements uncovered (the first at flat index ", first, ")");
    index.emplace(it.key(), std::move(t));
  }
  for (const ShardExtent& s : shards) {
    auto& v = tiles[s.rank];
    std::sort(v.begin(), v.end());
    uint64_t expect = 0;
    std::set<std::string> names;
    for (const auto& x : v) {
      if (x.first.first != expect)
        TUTTI_THROW(kCorrupt, "'", path, "': in shard ", s.rank, " tensor '", x.second,
                    "' starts at byte ", x.first.first, " but the previous piece ends at ",
                    expect, " (pieces must tile the shard's data)");
      if (!names.insert(x.second).second)
        TUTTI_THROW(kCorrupt, "'", path, "': shard ", s.rank, " holds two pieces of '",
                    x.second, "'");
      expect = x.first.second;
    }
    if (expect != s.data_bytes || v.size() != s.tensors)
      TUTTI_THROW(kCorrupt, "'", path, "': the index places ", v.size(), " pieces (",
                  expect, " bytes) in shard ", s.rank, ", whose record says ", s.tensors,
                  " tensors (", s.data_bytes, " bytes)");
  }
  return index;
}

uint64_t uncovered_elements(const IndexTensor& t, uint64_t* first_gap) {
  const uint64_t n = elements(t.shape);
  *first_gap = n;
  if (n == 0) return 0;
  bool whole = false, all_flat = true, same_dim = true;
  for (const IndexPiece& p : t.pieces) {
    whole = whole || p.placement.replicated();
    all_flat = all_flat && p.placement.flat;
    same_dim = same_dim && !p.placement.flat && p.placement.dim >= 0 &&
               p.placement.dim == t.pieces.front().placement.dim;
  }
  if (whole) return 0;
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  if (!t.pieces.empty() && (all_flat || same_dim)) {
    // One interval per piece: of the flat index, or of the split dimension
    // (a dim piece spans every index of the other dimensions).
    for (const IndexPiece& p : t.pieces) {
      const auto o = static_cast<uint64_t>(p.placement.offset);
      const uint64_t len =
          all_flat ? elements(p.placement.local_shape)
                   : static_cast<uint64_t>(p.placement.local_shape[static_cast<size_t>(p.placement.dim)]);
      if (len > 0) iv.push_back({o, o + len});
    }
    if (all_flat) return gaps(iv, n, first_gap);
    const size_t d = static_cast<size_t>(t.pieces.front().placement.dim);
    uint64_t first = 0;
    const uint64_t g = static_cast<uint64_t>(t.shape[d]);
    const uint64_t missing = gaps(iv, g, &first);
    if (missing == 0) return 0;
    *first_gap = first;  // an index of dimension d: close enough to name it
    return missing * (n / g);
  }
  for (const IndexPiece& p : t.pieces)
    for (const Run& r : placement_runs(p.placement)) iv.push_back({r.begin, r.begin + r.len});
  return gaps(iv, n, first_gap);
}

bool stored_once(const IndexTensor& t) {
  uint64_t sum = 0;
  for (const IndexPiece& p : t.pieces) sum += elements(p.placement.local_shape);
  return sum == elements(t.shape);
}

std::vector<std::vector<StoredTensor>> pieces_by_shard(const TensorIndex& index, int shards) {
  std::vector<std::vector<StoredTensor>> out(static_cast<size_t>(shards));
  for (const auto& kv : index)
    for (const IndexPiece& p : kv.second.pieces) {
      TUTTI_CHECK(p.shard >= 0 && p.shard < shards, "piece of shard ", p.shard);
      StoredTensor s;
      s.name = kv.first;
      s.dtype = kv.second.dtype;
      s.placement = p.placement;
      s.xxh64 = p.xxh64;
      s.begin = p.begin;
      s.end = p.end;
      out[static_cast<size_t>(p.shard)].push_back(std::move(s));
    }
  // The order of a parsed header (safetensors.h): (begin, end, name).
  for (auto& v : out)
    std::sort(v.begin(), v.end(), [](const StoredTensor& a, const StoredTensor& b) {
      if (a.begin != b.begin) return a.begin < b.begin;
      return a.end != b.end ? a.end < b.end : a.name < b.name;
    });
  return out;
}

}  // namespace ckpt
}  // namespace tutti
