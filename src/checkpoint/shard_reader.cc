#include "checkpoint/shard_reader.h"

#include <cstring>
#include <map>
#include <memory>

#include <xxhash.h>

#include "checkpoint/file_util.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr uint64_t kChunk = 16ull << 20;   // verification read size
constexpr uint64_t kStaging = 64ull << 20;  // staging buffer for scattered runs
constexpr uint64_t kDirect = 1ull << 20;    // host runs this large skip staging

struct XxhState {
  XXH64_state_t* s = XXH64_createState();
  ~XxhState() { XXH64_freeState(s); }
};

// Returns the pooled buffer on every path out.
struct PooledBuffer {
  HostBufferPool& pool;
  HostBuffer buf;
  PooledBuffer(HostBufferPool& p, size_t n) : pool(p), buf(p.acquire(n)) {}
  ~PooledBuffer() { pool.release(std::move(buf)); }
  unsigned char* data() { return buf.as<unsigned char>(); }
};

}  // namespace

void copy_out(const Tensor& dst, uint64_t dst_byte, const unsigned char* src, size_t n) {
  if (n == 0) return;
  char* to = static_cast<char*>(dst.data()) + dst_byte;
  if (!dst.is_cuda()) {
    std::memcpy(to, src, n);
    return;
  }
#if TUTTI_WITH_CUDA
  cuda::DeviceGuard guard(dst.device().index);
  // On the device when load() returns, whatever stream reads it next.
  cuda::copy_to_device_sync(to, src, n);
#else
  TUTTI_THROW(kUnsupported, "a checkpoint load reached a tensor on ",
              dst.device().str(), " in a build without CUDA support");
#endif
}

namespace {

// `base`: the piece's first byte in shard s's data region.
void read_piece(ShardFiles& files, int s, uint64_t base, const std::vector<CopyRange>& copies,
                size_t es, const Tensor& dst, HostBufferPool& pool) {
  const bool host = !dst.is_cuda();
  std::unique_ptr<PooledBuffer> staging;
  auto stage = [&]() -> unsigned char* {
    if (!staging) staging.reset(new PooledBuffer(pool, kStaging));
    return staging->data();
  };
  size_t i = 0;
  while (i < copies.size()) {
    const CopyRange& c = copies[i];
    const uint64_t bytes = c.len * es;
    if (host && bytes >= kDirect) {
      files.read(s, static_cast<char*>(dst.data()) + c.dst * es, bytes, base + c.src * es);
      ++i;
      continue;
    }
    if (bytes > kStaging) {  // a large run into device memory: in chunks
      for (uint64_t done = 0; done < bytes; done += kStaging) {
        const uint64_t n = std::min(kStaging, bytes - done);
        files.read(s, stage(), n, base + c.src * es + done);
        copy_out(dst, c.dst * es + done, stage(), n);
      }
      ++i;
      continue;
    }
    // Gather neighbouring small runs into one read of their span.
    size_t j = i;
    while (j + 1 < copies.size() && (!host || copies[j + 1].len * es < kDirect) &&
           (copies[j + 1].src + copies[j + 1].len - c.src) * es <= kStaging)
      ++j;
    const uint64_t span = (copies[j].src + copies[j].len - c.src) * es;
    files.read(s, stage(), span, base + c.src * es);
    for (size_t k = i; k <= j; ++k)
      copy_out(dst, copies[k].dst * es, stage() + (copies[k].src - c.src) * es,
               copies[k].len * es);
    i = j + 1;
  }
}

[[noreturn]] void bad_checksum(const std::string& path, const std::string& tensor, uint64_t h,
                               uint64_t want) {
  TUTTI_THROW(kCorrupt, "'", path, "': tensor '", tensor, "' fails its checksum (xxh64 ",
              hex64(h), ", header says ", hex64(want), "): the shard is corrupt");
}

}  // namespace

void verify_shard_data(const OpenedCheckpoint& ckpt, int s, ShardFiles& files,
                       HostBufferPool& pool) {
  const ShardIndex& shard = ckpt.shards[static_cast<size_t>(s)];
  files.open(s);
  const auto& ts = shard.tensors;
  uint64_t total = 0;
  for (const auto& t : ts) total = std::max(total, t.end);
  PooledBuffer buf(pool, static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(total, 1))));
  XxhState st;
  size_t t = 0;
  auto start_tensor = [&] { XXH64_reset(st.s, 0); };
  auto check = [&](const StoredTensor& x) {
    const uint64_t h = XXH64_digest(st.s);
    if (h != x.xxh64) bad_checksum(shard.path, x.name, h, x.xxh64);
  };
  start_tensor();
  // Tensors tile the data region in order (the parser checked it), so one
  // sequential pass feeds every tensor's hash.
  while (t < ts.size() && ts[t].end == ts[t].begin) {
    check(ts[t]);
    ++t;
  }
  for (uint64_t pos = 0; pos < total;) {
    const uint64_t n = std::min(kChunk, total - pos);
    files.read(s, buf.data(), n, pos);
    uint64_t used = 0;
    while (used < n && t < ts.size()) {
      const uint64_t take = std::min(n - used, ts[t].end - (pos + used));
      XXH64_update(st.s, buf.data() + used, static_cast<size_t>(take));
      used += take;
      while (t < ts.size() && ts[t].end == pos + used) {
        check(ts[t]);
        ++t;
        start_tensor();
      }
    }
    pos += n;
  }
}

void verify_piece(int s, const StoredTensor& piece, ShardFiles& files, HostBufferPool& pool) {
  const uint64_t total = piece.end - piece.begin;
  PooledBuffer buf(pool, static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(total, 1))));
  XxhState st;
  XXH64_reset(st.s, 0);
  for (uint64_t pos = 0; pos < total;) {
    const uint64_t n = std::min(kChunk, total - pos);
    files.read(s, buf.data(), n, piece.begin + pos);
    XXH64_update(st.s, buf.data(), static_cast<size_t>(n));
    pos += n;
  }
  files.open(s);  // a piece of no bytes still checks the shard's header
  const uint64_t h = XXH64_digest(st.s);
  if (h != piece.xxh64) bad_checksum(files.path(s), piece.name, h, piece.xxh64);
}

void execute_plan(const OpenedCheckpoint& ckpt, const LoadPlan& plan, const StateDict& dst,
                  ShardFiles& files, HostBufferPool& pool) {
  for (const auto& item : plan.items) {
    const Tensor& d = item.resized >= 0
                          ? plan.resized[static_cast<size_t>(item.resized)].rows
                          : dst[item.dst].tensor;
    for (const auto& src : item.sources) {
      if (src.reader >= 0) continue;  // read once for the node (node_share.h)
      const size_t es = dtype_size(src.piece->dtype);
      read_piece(files, src.shard, src.piece->begin, src.copies, es, d, pool);
      if (src.check_in_place) {
        const auto* bytes = static_cast<const unsigned char*>(d.data()) + src.copies[0].dst * es;
        const uint64_t h = XXH64(bytes, static_cast<size_t>(src.copies[0].len * es), 0);
        if (h != src.piece->xxh64)
          bad_checksum(ckpt.shards[static_cast<size_t>(src.shard)].path, src.piece->name, h,
                       src.piece->xxh64);
      }
    }
  }
}

}  // namespace ckpt
}  // namespace tutti
