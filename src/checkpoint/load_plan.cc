#include "checkpoint/load_plan.h"

#include <algorithm>

#include <xxhash.h>

#include "checkpoint/catalog.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace ckpt {
bool is_optional(const std::string& name, const LoadOptions& options) {
  for (const auto& o : options.optional) {
    if (o == name) return true;
    if (!o.empty() && o.back() == '/' && name.compare(0, o.size(), o) == 0) return true;
  }
  return false;
}

namespace {

void index_pieces(OpenedCheckpoint* c) {
  for (size_t s = 0; s < c->shards.size(); ++s)
    for (const auto& t : c->shards[s].tensors)
      c->pieces[t.name].push_back({static_cast<int>(s), &t});
}

OpenedCheckpoint from_index(const std::string& dir, Manifest manifest) {
  OpenedCheckpoint c;
  c.dir = dir;
  c.indexed = true;
  c.manifest = std::move(manifest);
  const Manifest& m = c.manifest;
  c.shards.resize(static_cast<size_t>(m.world_size));
  c.record_of.assign(static_cast<size_t>(m.world_size), -1);
  auto pieces = pieces_by_shard(m.tensors, m.world_size);
  for (int s = 0; s < m.world_size; ++s) {
    ShardIndex& idx = c.shards[static_cast<size_t>(s)];
    idx.rank = s;
    idx.world_size = m.world_size;
    idx.step = m.step;
    idx.tensors = std::move(pieces[static_cast<size_t>(s)]);
  }
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& rec = m.shards[i];
    ShardIndex& idx = c.shards[static_cast<size_t>(rec.rank)];
    idx.path = join_path(dir, rec.file);
    idx.file_bytes = rec.bytes;
    c.record_of[static_cast<size_t>(rec.rank)] = static_cast<int>(i);
  }
  for (const auto& kv : m.tensors) c.tensors[kv.first] = {kv.second.dtype, kv.second.shape};
  index_pieces(&c);
  return c;
}

}  // namespace

OpenedCheckpoint open_checkpoint(const std::string& dir, ReadStats* stats) {
  const std::string path = join_path(dir, kManifestName);
  const std::string text = read_file(path, max_header_bytes());
  if (stats) {
    ++stats->files_opened;
    stats->bytes_read += text.size();
  }
  return open_checkpoint(dir, parse_manifest(text, path), stats);
}

OpenedCheckpoint open_checkpoint(const std::string& dir, Manifest manifest, ReadStats* stats) {
  const std::string mpath = join_path(dir, kManifestName);
  const size_t slash = dir.find_last_of('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  if (manifest.name != base)
    TUTTI_THROW(kCorrupt, "'", mpath, "' names the checkpoint '", manifest.name,
                "' but lies in '", base, "'");
  if (manifest.indexed) return from_index(dir, std::move(manifest));
  OpenedCheckpoint c;
  c.dir = dir;
  c.manifest = std::move(manifest);
  for (const auto& rec : c.manifest.shards) {
    const std::string path = join_path(dir, rec.file);
    if (!path_exists(path))
      TUTTI_THROW(kCorrupt, "'", path, "' is missing (the manifest lists it)");
    const uint64_t size = file_size(path);
    if (size != rec.bytes)
      TUTTI_THROW(kCorrupt, "'", path, "' has ", size, " bytes; the manifest says ",
                  rec.bytes);
    std::string header;
    ShardIndex idx = read_shard_index(path, &header);
    if (stats) {
      ++stats->files_opened;
      stats->bytes_read += header.size();
    }
    const uint64_t h = XXH64(header.data(), header.size(), 0);
    if (h != rec.header_xxh64)
      TUTTI_THROW(kCorrupt, "'", path, "': header checksum ", hex64(h),
                  " does not match the manifest's ", hex64(rec.header_xxh64));
    if (idx.rank != rec.rank || idx.world_size != c.manifest.world_size ||
        idx.step != c.manifest.step || idx.tensors.size() != rec.tensors)
      TUTTI_THROW(kCorrupt, "'", path, "' describes rank ", idx.rank, " of ",
                  idx.world_size, " at step ", idx.step, " with ", idx.tensors.size(),
                  " tensors; the manifest expects rank ", rec.rank, " of ",
                  c.manifest.world_size, " at step ", c.manifest.step, " with ",
                  rec.tensors);
    c.shards.push_back(std::move(idx));
    c.record_of.push_back(rec.rank);
  }
  index_pieces(&c);
  for (const auto& kv : c.pieces) {
    const StoredTensor* first = kv.second.front().second;
    c.tensors[kv.first] = {first->dtype, first->placement.global_shape};
    for (const auto& p : kv.second) {
      if (p.second->dtype != first->dtype ||
          p.second->placement.global_shape != first->placement.global_shape)
        TUTTI_THROW(kCorrupt, "checkpoint '", dir, "': tensor '", kv.first,
                    "' is ", dtype_safetensors_name(first->dtype),
                    shape_str(first->placement.global_shape), " in shard ",
                    kv.second.front().first, " but ",
                    dtype_safetensors_name(p.second->dtype),
                    shape_str(p.second->placement.global_shape), " in shard ",
                    p.first);
    }
  }
  return c;
}

namespace {

const std::vector<std::pair<int, const StoredTensor*>> kNoPieces;

// A per-rank tensor whose stored rows differ from the destination's only in
// their number, which is the checkpoint's world size, and that has a hook.
bool resizable(const NamedTensor& nt, const Placement& dst, const OpenedCheckpoint::Kind& stored,
               int saved_world) {
  const std::vector<int64_t>& g = stored.shape;
  return nt.shard.per_rank && nt.shard.on_resize && stored.dtype == nt.tensor.dtype() &&
         g.size() == dst.global_shape.size() && !g.empty() && g[0] == saved_world &&
         std::equal(g.begin() + 1, g.end(), dst.global_shape.begin() + 1);
}

// The pieces that give a destination placed at `dp` its `need` elements.
PlanItem plan_sources(const OpenedCheckpoint& ckpt,
                      std::vector<std::pair<int, const StoredTensor*>> order,
                      const Placement& dp, uint64_t need, int rank, const std::string& what,
                      std::set<int>* shards_read) {
  const int nshards = static_cast<int>(ckpt.shards.size());
  // Prefer this rank's own shard, then the following ones, so that ranks
  // spread their reads of replicated tensors.
  const int start = nshards > 0 ? rank % nshards : 0;
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return (a.first - start + nshards) % nshards < (b.first - start + nshards) % nshards;
  });
  const std::vector<Run> dst_runs = placement_runs(dp);
  IntervalSet covered;
  PlanItem item;
  for (const auto& p : order) {
    if (covered.total() >= need) break;
    PieceCopies pc;
    pc.shard = p.first;
    pc.piece = p.second;
    pc.copies = plan_copies(placement_runs(p.second->placement), dst_runs, covered);
    if (pc.copies.empty()) continue;
    shards_read->insert(p.first);
    item.sources.push_back(std::move(pc));
  }
  // covered counts global elements, and dst_runs hold exactly `need`.
  if (covered.total() < need) {
    TUTTI_THROW(kCorrupt, "checkpoint ", ckpt.manifest.name, " lacks ",
                need - covered.total(), " of the ", need,
                " elements this rank needs of ", what,
                " (no shard holds them; was it written by a different job?)");
  }
  return item;
}

}  // namespace

LoadPlan plan_load(const OpenedCheckpoint& ckpt, const StateDict& dst,
                   const LoadOptions& options, int rank) {
  LoadPlan plan;
  const int nshards = static_cast<int>(ckpt.shards.size());
  std::set<std::string> wanted;
  for (size_t i = 0; i < dst.size(); ++i) {
    const NamedTensor& nt = dst[i];
    const std::string what = "tensor '" + nt.name + "'";
    TUTTI_ARG_CHECK(wanted.insert(nt.name).second, what,
                    " appears twice in the state to load");
    const Placement dp = make_placement(nt.tensor.shape().vec(), nt.shard,
                                        ErrorCode::kInvalidArgument, what);
    const bool optional = is_optional(nt.name, options);
    auto it = ckpt.tensors.find(nt.name);
    std::string problem;
    if (it == ckpt.tensors.end()) {
      problem = detail::cat("is not in checkpoint ", ckpt.manifest.name, " (it holds ",
                            ckpt.tensors.size(), " tensor names, written by ",
                            nshards, " ranks)");
    } else {
      const OpenedCheckpoint::Kind& first = it->second;
      if (first.dtype != nt.tensor.dtype())
        problem = detail::cat("is ", dtype_name(nt.tensor.dtype()),
                              " but checkpoint ", ckpt.manifest.name, " stores ",
                              dtype_name(first.dtype));
      else if (first.shape != dp.global_shape)
        problem = detail::cat("has global shape ", shape_str(dp.global_shape),
                              " but checkpoint ", ckpt.manifest.name, " stores ",
                              shape_str(first.shape),
                              nt.shard.per_rank
                                  ? detail::cat(" (per-rank state of ", ckpt.manifest.world_size,
                                                " ranks: give it a ShardInfo::on_resize hook "
                                                "or list it in LoadOptions::optional)")
                                  : std::string());
    }
    const auto& pieces = ckpt.pieces.count(nt.name) ? ckpt.pieces.at(nt.name) : kNoPieces;
    if (!problem.empty() && it != ckpt.tensors.end() &&
        resizable(nt, dp, it->second, ckpt.manifest.world_size)) {
      ResizedRows rr;
      rr.dst = i;
      std::vector<int64_t> dims = it->second.shape;
      rr.bytes.assign(static_cast<size_t>(checked_numel(dims, what)) *
                          dtype_size(nt.tensor.dtype()), 0);
      rr.rows = Tensor(rr.bytes.data(), nt.tensor.dtype(), Shape(dims));
      const Placement rows = make_placement(dims, ShardInfo(), ErrorCode::kInvalidArgument, what);
      std::set<int> read;
      PlanItem item = plan_sources(ckpt, pieces, rows,
                                   static_cast<uint64_t>(rr.rows.numel()), rank, what, &read);
      for (PieceCopies& pc : item.sources) {
        const uint64_t n = (pc.piece->end - pc.piece->begin) / dtype_size(pc.piece->dtype);
        pc.check_in_place = pc.copies.size() == 1 && pc.copies[0].src == 0 &&
                            pc.copies[0].len == n;
        if (!pc.check_in_place) plan.shards_read.insert(pc.shard);
      }
      item.dst = i;
      item.resized = static_cast<int>(plan.resized.size());
      plan.resized.push_back(std::move(rr));
      plan.items.push_back(std::move(item));
      continue;
    }
    if (!problem.empty()) {
      if (optional) {
        TUTTI_LOG(kWarn) << "checkpoint load: optional " << what << " " << problem
                         << "; it keeps its current value";
        plan.skipped.push_back(nt.name);
        continue;
      }
      TUTTI_THROW(kMismatch, what, " ", problem);
    }
    PlanItem item = plan_sources(ckpt, pieces, dp, static_cast<uint64_t>(nt.tensor.numel()),
                                 rank, what, &plan.shards_read);
    item.dst = i;
    plan.items.push_back(std::move(item));
  }
  for (const auto& kv : ckpt.tensors)
    if (!wanted.count(kv.first)) ++plan.unused;
  return plan;
}

void apply_resized(const LoadPlan& plan, const StateDict& dst, int saved_world,
                   int world, int rank) {
  for (const ResizedRows& rr : plan.resized) {
    const NamedTensor& nt = dst[rr.dst];
    PerRankResize r;
    r.name = nt.name;
    r.saved = rr.rows;
    r.saved_world = saved_world;
    r.world = world;
    r.rank = rank;
    r.dst = nt.tensor;
    nt.shard.on_resize(r);
  }
}

}  // namespace ckpt
}  // namespace tutti
