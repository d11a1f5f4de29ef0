#include "checkpoint/shard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xxhash.h>

#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_index.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {

namespace {

constexpr uint64_t kDirectChunk = 64ull << 20;

// Writes data[0, aligned) with O_DIRECT at `base`; false if the file system
// refused direct I/O before anything was written (the caller falls back).
bool write_direct(const std::string& path, const unsigned char* data, uint64_t aligned,
                  uint64_t base) {
  File d;
  if (!File::open_direct(path, &d)) return false;
  for (uint64_t off = 0; off < aligned; off += kDirectChunk) {
    const uint64_t n = std::min(kDirectChunk, aligned - off);
    const int err = d.pwrite_all(data + off, static_cast<size_t>(n), base + off);
    if (err == EINVAL && off == 0) return false;
    if (err != 0)
      TUTTI_THROW(kIo, "writing '", path, "' (direct I/O) failed: ", std::strerror(err));
    if (off < aligned / 2 && off + n >= aligned / 2) fault::fault_point("mid_shard_write");
  }
  d.close();
  return true;
}

void write_at(File& f, const unsigned char* data, uint64_t n, uint64_t offset) {
  const int err = f.pwrite_all(data, static_cast<size_t>(n), offset);
  if (err != 0) TUTTI_THROW(kIo, "writing '", f.path(), "' failed: ", std::strerror(err));
}

}  // namespace

ShardWriteResult write_shard(const std::string& dir, const Snapshot& snap,
                             int rank, int world_size, int64_t step, bool direct_io,
                             unsigned file_mode, bool skip_empty) {
  if (skip_empty && snap.tensors.empty()) return ShardWriteResult();
  fault::fault_point("before_shard_write");
  // Per-tensor checksums go into the header, which precedes the data: hash
  // the snapshot first (one pass over memory), then write.
  std::vector<StoredTensor> stored;
  std::vector<StEntry> entries;
  stored.reserve(snap.tensors.size());
  for (const auto& t : snap.tensors) {
    StoredTensor s;
    s.name = t.name;
    s.dtype = t.dtype;
    s.placement = t.placement;
    s.group = t.group;
    s.begin = t.offset;
    s.end = t.offset + t.bytes;
    s.xxh64 = XXH64(snap.data() + t.offset, static_cast<size_t>(t.bytes), 0);
    entries.push_back({t.name, t.dtype, t.placement.local_shape, s.begin, s.end});
    stored.push_back(std::move(s));
  }
  const std::string header =
      build_safetensors_header(entries, encode_shard_metadata(rank, world_size, step, stored),
                               direct_io ? kSnapshotAlign : 8);

  ShardWriteResult r;
  r.written = true;
  r.header_xxh64 = XXH64(header.data(), header.size(), 0);
  r.tensors = stored.size();
  r.data_bytes = snap.total;
  r.bytes = header.size() + snap.total;

  const std::string final_name = shard_file_name(rank);
  const std::string tmp = join_path(dir, "." + final_name + ".tmp");
  try {
    File f = File::create(tmp, file_mode);
    f.write_all(header.data(), header.size());
    const uint64_t base = header.size();
    const uint64_t aligned =
        direct_io && base % kSnapshotAlign == 0 ? snap.total / kSnapshotAlign * kSnapshotAlign : 0;
    r.direct = aligned > 0 && write_direct(tmp, snap.data(), aligned, base);
    if (r.direct) {
      write_at(f, snap.data() + aligned, snap.total - aligned, base + aligned);
    } else {
      const uint64_t half = snap.total / 2;
      write_at(f, snap.data(), half, base);
      fault::fault_point("mid_shard_write");
      write_at(f, snap.data() + half, snap.total - half, base + half);
    }
    fault::fault_point("after_shard_write");
    fault::fault_point("before_fsync");
    f.sync();
    f.close();
    fault::fault_point("after_fsync");
    rename_path(tmp, join_path(dir, final_name));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(dir);
  fault::fault_point("after_rename");
  r.stored = std::move(stored);
  return r;
}

}  // namespace ckpt
}  // namespace tutti
