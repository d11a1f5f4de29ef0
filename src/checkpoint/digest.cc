#include "checkpoint/digest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace tutti {
namespace ckpt {
namespace {

constexpr size_t kBlocks = 16;
constexpr size_t kBlock = 64;
constexpr size_t kSample = kBlocks * kBlock;

// Byte offsets of the sampled blocks of an n-byte tensor (n > kSample).
size_t block_offset(size_t n, size_t i) { return i * (n - kBlock) / (kBlocks - 1); }

uint64_t hash_with_count(const Tensor& t, const void* bytes, size_t n) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  const int64_t numel = t.numel();
  XXH3_64bits_update(s, &numel, sizeof numel);
  XXH3_64bits_update(s, bytes, n);
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

// Returns the pooled buffer on every path out.
struct Pooled {
  HostBufferPool& pool;
  HostBuffer buf;
  Pooled(HostBufferPool& p, size_t n) : pool(p), buf(p.acquire(std::max<size_t>(n, 1))) {}
  ~Pooled() { pool.release(std::move(buf)); }
  unsigned char* data() { return buf.as<unsigned char>(); }
};

}  // namespace

std::vector<uint64_t> replica_digests(const std::vector<Tensor>& tensors, ReplicaCheck check,
                                      SnapshotCopier& copier, HostBufferPool& pool) {
  std::vector<uint64_t> out(tensors.size(), 0);
  // Samples of every CUDA tensor land in one buffer, behind one host wait.
  std::vector<size_t> sampled;
  size_t sample_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.is_cuda()) {
      out[i] = hash_with_count(t, t.data(), t.nbytes());
    } else if (check == ReplicaCheck::kSample) {
      sampled.push_back(i);
      sample_bytes += std::min(t.nbytes(), kSample);
    }
  }
  if (!sampled.empty()) {
    Pooled buf(pool, sample_bytes);
    size_t at = 0;
    for (size_t i : sampled) {
      const Tensor& t = tensors[i];
      const Tensor bytes(t.data(), DType::kUInt8, Shape{static_cast<int64_t>(t.nbytes())},
                         t.device());
      if (t.nbytes() <= kSample) {
        copier.copy(bytes, buf.data() + at);
      } else {
        for (size_t b = 0; b < kBlocks; ++b) {
          const auto off = static_cast<int64_t>(block_offset(t.nbytes(), b));
          copier.copy(bytes.slice(off, off + static_cast<int64_t>(kBlock)),
                      buf.data() + at + b * kBlock);
        }
      }
      at += std::min(t.nbytes(), kSample);
    }
    copier.finish();
    copier.wait();
    at = 0;
    for (size_t i : sampled) {
      const size_t n = std::min(tensors[i].nbytes(), kSample);
      out[i] = hash_with_count(tensors[i], buf.data() + at, n);
      at += n;
    }
  }
  if (check == ReplicaCheck::kFull) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      if (!t.is_cuda()) continue;
      Pooled buf(pool, t.nbytes());
      copier.copy(t, buf.data());
      copier.finish();
      copier.wait();
      out[i] = hash_with_count(t, buf.data(), t.nbytes());
    }
  }
  return out;
}

}  // namespace ckpt
}  // namespace tutti
