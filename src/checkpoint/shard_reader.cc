#include "checkpoint/shard_reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include <xxhash.h>

#include "checkpoint/device_upload.h"
#include "checkpoint/file_util.h"
#include "checkpoint/untrusted_json.h"
#include "core/check.h"
#include "core/cuda_utils.h"

namespace tutti {
namespace ckpt {
namespace {

// Verification read size per thread (not mapped): small, since each thread
// holds one pooled (pinned, kept) buffer of it.
constexpr uint64_t kChunk = 4ull << 20;
constexpr uint64_t kStaging = 64ull << 20;  // staging buffer for scattered host runs
constexpr uint64_t kDirect = 1ull << 20;    // host runs this large skip staging
constexpr uint64_t kJob = 8ull << 20;       // one thread's share of a large copy

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

[[noreturn]] void bad_checksum(const std::string& path, const std::string& tensor, uint64_t h,
                               uint64_t want) {
  TUTTI_THROW(kCorrupt, "'", path, "': tensor '", tensor, "' fails its checksum (xxh64 ",
              hex64(h), ", header says ", hex64(want), "): the shard is corrupt");
}

// XXH64 of the piece's bytes: in place when the shard is mapped, else read
// in chunks through a pooled buffer.
uint64_t hash_piece(const ShardView& v, const StoredTensor& piece, HostBufferPool& pool) {
  const uint64_t total = piece.end - piece.begin;
  if (const unsigned char* p = v.at(piece.begin, total))
    return XXH64(p, static_cast<size_t>(total), 0);
  PooledBuffer buf(pool, static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(total, 1))));
  XxhState st;
  XXH64_reset(st.s, 0);
  for (uint64_t pos = 0; pos < total;) {
    const uint64_t n = std::min(kChunk, total - pos);
    v.read(buf.data(), n, piece.begin + pos);
    XXH64_update(st.s, buf.data(), static_cast<size_t>(n));
    pos += n;
  }
  return XXH64_digest(st.s);
}

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

void verify_pieces(int s, const std::vector<const StoredTensor*>& pieces, ShardFiles& files,
                   HostBufferPool& pool, LoadWorkers& workers) {
  const ShardView v = files.view(s);  // a piece of no bytes still checks the header
  // The largest first, so that one large tensor does not finish last alone.
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return pieces[a]->end - pieces[a]->begin > pieces[b]->end - pieces[b]->begin;
  });
  std::vector<uint64_t> got(pieces.size(), 0);
  workers.run(order.size(), [&](size_t i) {
    got[order[i]] = hash_piece(v, *pieces[order[i]], pool);
  });
  uint64_t bytes = 0;
  for (const StoredTensor* p : pieces) bytes += p->end - p->begin;
  files.count_read(bytes);
  // The first piece that differs, in the shard's order.
  for (size_t i = 0; i < pieces.size(); ++i)
    if (got[i] != pieces[i]->xxh64)
      bad_checksum(files.path(s), pieces[i]->name, got[i], pieces[i]->xxh64);
}

void verify_shard_data(const OpenedCheckpoint& ckpt, int s, ShardFiles& files,
                       HostBufferPool& pool, LoadWorkers& workers) {
  // Tensors tile the data region in order (the parser checked it), so
  // their hashes cover every byte of it once.
  std::vector<const StoredTensor*> all;
  for (const auto& t : ckpt.shards[static_cast<size_t>(s)].tensors) all.push_back(&t);
  verify_pieces(s, all, files, pool, workers);
}

namespace {

// One thread's share of a large host copy.
struct CopyJob {
  unsigned char* dst;
  uint64_t src;  // byte in the shard's data region
  uint64_t n;
};

// Host runs below kDirect: neighbours gathered into one read of their span
// through staging, then copied out.  Runs of kDirect or more go to `jobs`,
// cut into kJob pieces read straight into the tensor by several threads.
void read_host_runs(ShardFiles& files, int s, uint64_t base,
                    const std::vector<CopyRange>& copies, size_t es, const Tensor& dst,
                    HostBufferPool& pool, std::vector<CopyJob>* jobs) {
  std::unique_ptr<PooledBuffer> staging;
  auto* out = static_cast<unsigned char*>(dst.data());
  size_t i = 0;
  while (i < copies.size()) {
    const CopyRange& c = copies[i];
    const uint64_t bytes = c.len * es;
    if (bytes >= kDirect) {
      for (uint64_t done = 0; done < bytes; done += kJob)
        jobs->push_back({out + c.dst * es + done, base + c.src * es + done,
                         std::min(kJob, bytes - done)});
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < copies.size() && copies[j + 1].len * es < kDirect &&
           (copies[j + 1].src + copies[j + 1].len - c.src) * es <= kStaging)
      ++j;
    const uint64_t span = (copies[j].src + copies[j].len - c.src) * es;
    if (!staging) staging.reset(new PooledBuffer(pool, kStaging));
    files.read(s, staging->data(), span, base + c.src * es);
    for (size_t k = i; k <= j; ++k)
      std::memcpy(out + copies[k].dst * es, staging->data() + (copies[k].src - c.src) * es,
                  static_cast<size_t>(copies[k].len * es));
    i = j + 1;
  }
}

// Reads n bytes at `src` of shard s's data region into `to`, cut among the
// threads.
void parallel_read(const ShardView& v, unsigned char* to, uint64_t n, uint64_t src,
                   LoadWorkers& workers) {
  const uint64_t parts = std::max<uint64_t>(
      1, std::min<uint64_t>(static_cast<uint64_t>(workers.threads()), n / kDirect));
  const uint64_t each = (n + parts - 1) / parts;
  workers.run(static_cast<size_t>(parts), [&](size_t p) {
    const uint64_t at = p * each;
    if (at < n) v.read(to + at, std::min(each, n - at), src + at);
  });
}

// CUDA destination: every run through the double-buffered staging.  Runs
// larger than a buffer go in buffer-sized chunks; smaller neighbours share
// one read of their span.
void upload_runs(ShardFiles& files, int s, uint64_t base, const std::vector<CopyRange>& copies,
                 size_t es, const Tensor& dst, DeviceUpload& up, LoadWorkers& workers) {
  const uint64_t cap = DeviceUpload::kChunk;
  size_t i = 0;
  while (i < copies.size()) {
    const CopyRange& c = copies[i];
    size_t j = i;
    while (j + 1 < copies.size() && (copies[j + 1].src + copies[j + 1].len - c.src) * es <= cap)
      ++j;
    const uint64_t span = (copies[j].src + copies[j].len - c.src) * es;
    if (j == i && span > cap) {  // one large run, in chunks
      for (uint64_t done = 0; done < span; done += cap) {
        const uint64_t n = std::min(cap, span - done);
        unsigned char* buf = up.buffer();
        parallel_read(files.view(s), buf, n, base + c.src * es + done, workers);
        files.count_read(n);
        up.copy(dst, c.dst * es + done, buf, static_cast<size_t>(n));
        up.flip();
      }
      ++i;
      continue;
    }
    unsigned char* buf = up.buffer();
    parallel_read(files.view(s), buf, span, base + c.src * es, workers);
    files.count_read(span);
    for (size_t k = i; k <= j; ++k)
      up.copy(dst, copies[k].dst * es, buf + (copies[k].src - c.src) * es,
              static_cast<size_t>(copies[k].len * es));
    up.flip();
    i = j + 1;
  }
}

}  // namespace

void execute_plan(const OpenedCheckpoint& ckpt, const LoadPlan& plan, const StateDict& dst,
                  ShardFiles& files, HostBufferPool& pool, LoadWorkers& workers) {
  std::map<int, std::vector<CopyJob>> jobs;  // shard -> large host copies
  DeviceUpload up(pool);
  auto run_jobs = [&] {
    for (auto& kv : jobs) {
      const ShardView v = files.view(kv.first);
      const std::vector<CopyJob>& js = kv.second;
      workers.run(js.size(), [&](size_t k) { v.read(js[k].dst, js[k].n, js[k].src); });
      for (const CopyJob& j : js) files.count_read(j.n);
    }
    jobs.clear();
  };
  for (const auto& item : plan.items) {
    const Tensor& d = item.resized >= 0
                          ? plan.resized[static_cast<size_t>(item.resized)].rows
                          : dst[item.dst].tensor;
    for (const auto& src : item.sources) {
      if (src.reader >= 0) continue;  // read once for the node (node_share.h)
      const size_t es = dtype_size(src.piece->dtype);
      if (d.is_cuda()) {
        upload_runs(files, src.shard, src.piece->begin, src.copies, es, d, up, workers);
      } else {
        read_host_runs(files, src.shard, src.piece->begin, src.copies, es, d, pool,
                       &jobs[src.shard]);
        // Never more shards pending than ShardFiles keeps open.
        if (jobs.size() >= ShardFiles::kMaxOpen / 2) run_jobs();
      }
    }
  }
  run_jobs();
  up.finish();
  for (const auto& item : plan.items) {
    if (item.resized < 0) continue;
    const Tensor& d = plan.resized[static_cast<size_t>(item.resized)].rows;
    for (const auto& src : item.sources) {
      if (!src.check_in_place || src.reader >= 0) continue;
      const size_t es = dtype_size(src.piece->dtype);
      const auto* bytes = static_cast<const unsigned char*>(d.data()) + src.copies[0].dst * es;
      const uint64_t h = XXH64(bytes, static_cast<size_t>(src.copies[0].len * es), 0);
      if (h != src.piece->xxh64)
        bad_checksum(ckpt.shards[static_cast<size_t>(src.shard)].path, src.piece->name, h,
                     src.piece->xxh64);
    }
  }
}

}  // namespace ckpt
}  // namespace tutti
