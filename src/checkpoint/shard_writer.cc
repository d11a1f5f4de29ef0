#include "checkpoint/shard_writer.h"

#include <unistd.h>

#include <xxhash.h>

#include "checkpoint/fault_inject.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_index.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {

ShardWriteResult write_shard(const std::string& dir, const Snapshot& snap,
                             int rank, int world_size, int64_t step) {
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
  const std::string header = build_safetensors_header(
      entries, encode_shard_metadata(rank, world_size, step, stored));

  ShardWriteResult r;
  r.header_xxh64 = XXH64(header.data(), header.size(), 0);
  r.tensors = stored.size();
  r.data_bytes = snap.total;
  r.bytes = header.size() + snap.total;

  const std::string final_name = shard_file_name(rank);
  const std::string tmp = join_path(dir, "." + final_name + ".tmp");
  try {
    File f = File::create(tmp);
    f.write_all(header.data(), header.size());
    const size_t half = static_cast<size_t>(snap.total / 2);
    f.write_all(snap.data(), half);
    fault::fault_point("mid_shard_write");
    f.write_all(snap.data() + half, static_cast<size_t>(snap.total) - half);
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
  return r;
}

}  // namespace ckpt
}  // namespace tutti
