#include "checkpoint/shard_files.h"

#include <xxhash.h>

#include <cstring>

#include "checkpoint/safetensors.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

bool same_piece(const StoredTensor& a, const StoredTensor& b) {
  const Placement &p = a.placement, &q = b.placement;
  return a.name == b.name && a.dtype == b.dtype && a.begin == b.begin && a.end == b.end &&
         a.xxh64 == b.xxh64 && p.local_shape == q.local_shape &&
         p.global_shape == q.global_shape && p.flat == q.flat && p.dim == q.dim &&
         p.offset == q.offset;
}

std::string piece_str(const StoredTensor& t) {
  const Placement& p = t.placement;
  return detail::cat("'", t.name, "' ", dtype_safetensors_name(t.dtype), shape_str(p.local_shape),
                     " of ", shape_str(p.global_shape),
                     p.flat ? detail::cat(" flat at ", p.offset)
                            : p.dim >= 0 ? detail::cat(" dim ", p.dim, " at ", p.offset) : "",
                     " bytes [", t.begin, ", ", t.end, ") xxh64 ", hex64(t.xxh64));
}

}  // namespace

const std::string& ShardFiles::path(int s) const {
  return ckpt_.shards[static_cast<size_t>(s)].path;
}

uint64_t ShardFiles::check_indexed(int s, const File& f) {
  const std::string& p = path(s);
  const ShardRecord& rec =
      ckpt_.manifest.shards[static_cast<size_t>(ckpt_.record_of[static_cast<size_t>(s)])];
  const uint64_t size = f.size();
  if (size != rec.bytes)
    TUTTI_THROW(kCorrupt, "'", p, "' has ", size, " bytes; the manifest says ", rec.bytes);
  unsigned char prefix[8] = {};
  if (size >= 8) f.pread_all(prefix, 8, 0);
  const uint64_t n = parse_header_length(prefix, size, max_header_bytes(), p);
  std::string header(8 + static_cast<size_t>(n), '\0');
  f.pread_all(&header[0], header.size(), 0);
  if (stats_) stats_->bytes_read += header.size();
  const uint64_t h = XXH64(header.data(), header.size(), 0);
  if (h != rec.header_xxh64)
    TUTTI_THROW(kCorrupt, "'", p, "': header checksum ", hex64(h),
                " does not match the manifest's ", hex64(rec.header_xxh64));
  const ShardIndex idx = decode_shard(
      parse_header_json(header.data() + 8, static_cast<size_t>(n), n, size - 8 - n, p), p, size);
  const ShardIndex& want = ckpt_.shards[static_cast<size_t>(s)];
  if (idx.rank != s || idx.world_size != ckpt_.manifest.world_size ||
      idx.step != ckpt_.manifest.step || idx.tensors.size() != want.tensors.size())
    TUTTI_THROW(kCorrupt, "'", p, "' describes rank ", idx.rank, " of ", idx.world_size,
                " at step ", idx.step, " with ", idx.tensors.size(),
                " tensors; the manifest expects rank ", s, " of ", ckpt_.manifest.world_size,
                " at step ", ckpt_.manifest.step, " with ", want.tensors.size());
  for (size_t i = 0; i < idx.tensors.size(); ++i)
    if (!same_piece(idx.tensors[i], want.tensors[i]))
      TUTTI_THROW(kCorrupt, "'", p, "': its header describes ", piece_str(idx.tensors[i]),
                  " where the manifest's index has ", piece_str(want.tensors[i]));
  return idx.data_start;
}

ShardFiles::Slot& ShardFiles::slot(int s) {
  TUTTI_CHECK(s >= 0 && static_cast<size_t>(s) < ckpt_.shards.size(), "shard ", s);
  auto it = open_.find(s);
  if (it == open_.end()) {
    if (path(s).empty())
      TUTTI_THROW(kCorrupt, "checkpoint '", ckpt_.dir, "': rank ", s,
                  " wrote no shard, yet a piece lies in it");
    if (open_.size() >= kMaxOpen) {
      auto lru = open_.begin();
      for (auto o = open_.begin(); o != open_.end(); ++o)
        if (o->second.used < lru->second.used) lru = o;
      open_.erase(lru);
    }
    if (!checked_.count(s) && !path_exists(path(s)))
      TUTTI_THROW(kCorrupt, "'", path(s), "' is missing (the manifest lists it)");
    Slot sl;
    sl.file = File::open_read(path(s));
    if (stats_) ++stats_->files_opened;
    auto done = checked_.find(s);
    if (done != checked_.end()) {
      sl.data_start = done->second;
    } else if (ckpt_.indexed) {
      sl.data_start = check_indexed(s, sl.file);
      checked_[s] = sl.data_start;
    } else {
      sl.data_start = ckpt_.shards[static_cast<size_t>(s)].data_start;
      checked_[s] = sl.data_start;
    }
    sl.map = MappedFile::map_if_in_ram(sl.file.fd(), sl.file.size());
    it = open_.emplace(s, std::move(sl)).first;
  }
  it->second.used = ++clock_;
  return it->second;
}

void ShardFiles::open(int s) { slot(s); }

ShardView ShardFiles::view(int s) {
  Slot& sl = slot(s);
  ShardView v;
  v.file = &sl.file;
  v.data_start = sl.data_start;
  if (sl.map.mapped() && sl.map.size() >= sl.data_start) {
    v.map = sl.map.data() + sl.data_start;
    v.data_bytes = sl.map.size() - sl.data_start;
  }
  return v;
}

void ShardFiles::count_read(uint64_t n) {
  if (stats_) stats_->bytes_read += n;
}

void ShardFiles::read(int s, void* dst, uint64_t n, uint64_t offset) {
  if (n == 0) return;
  view(s).read(dst, n, offset);
  count_read(n);
}

const unsigned char* ShardView::at(uint64_t offset, uint64_t n) const {
  if (!map) return nullptr;
  if (offset > data_bytes || n > data_bytes - offset)
    TUTTI_THROW(kCorrupt, "'", file->path(), "' ends at byte ", data_start + data_bytes,
                " but bytes up to ", data_start + offset + n,
                " were expected (truncated file)");
  return map + offset;
}

void ShardView::read(void* dst, uint64_t n, uint64_t offset) const {
  if (n == 0) return;
  if (const unsigned char* p = at(offset, n)) {
    std::memcpy(dst, p, static_cast<size_t>(n));
    return;
  }
  file->pread_all(dst, static_cast<size_t>(n), data_start + offset);
}

}  // namespace ckpt
}  // namespace tutti
