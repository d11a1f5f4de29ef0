#include "fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "checkpoint/manifest.h"
#include "checkpoint/manifest_index.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_geometry.h"
#include "checkpoint/shard_index.h"
#include "tutti/error.h"

namespace tutti {
namespace fuzz {
namespace {

constexpr uint64_t kCap = 1 << 20;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

void expect_corrupt(const Error& e) {
  if (e.code() != ErrorCode::kCorrupt) {
    std::fprintf(stderr, "unexpected error code: %s\n", e.what());
    std::abort();
  }
}

}  // namespace

int safetensors_one(const uint8_t* data, size_t size) {
  ckpt::StHeader h;
  try {
    h = ckpt::parse_safetensors(data, size, kCap, "fuzz");
  } catch (const Error& e) {
    expect_corrupt(e);
    return 0;
  }
  if (h.data_start() + h.data_bytes != size) broken("regions do not add up to the size");
  uint64_t prev_end = 0;
  for (const auto& e : h.entries) {
    if (e.begin != prev_end || e.end < e.begin || e.end > h.data_bytes)
      broken("entry outside the data region or not tiling it");
    const uint64_t n = ckpt::checked_numel(e.shape, "fuzz");
    if (n * dtype_size(e.dtype) != e.end - e.begin) broken("dtype x shape != bytes");
    prev_end = e.end;
  }
  // The tutti layer on top: metadata must describe consistent placements.
  try {
    const ckpt::ShardIndex idx = ckpt::decode_shard(h, "fuzz", size);
    for (const auto& t : idx.tensors) {
      uint64_t local = 0;
      for (const auto& r : ckpt::placement_runs(t.placement)) local += r.len;
      if (local != ckpt::checked_numel(t.placement.local_shape, "fuzz"))
        broken("placement runs do not cover the local tensor");
      if (t.end > h.data_bytes) broken("stored tensor outside the data");
    }
  } catch (const Error& e) {
    expect_corrupt(e);
  }
  return 1;
}

int manifest_one(const uint8_t* data, size_t size) {
  try {
    const ckpt::Manifest m =
        ckpt::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    if (!m.indexed) {  // versions 1 and 2: one shard per rank, in rank order
      if (m.shards.size() != static_cast<size_t>(m.world_size)) broken("shard count");
      for (size_t i = 0; i < m.shards.size(); ++i)
        if (m.shards[i].rank != static_cast<int>(i) ||
            m.shards[i].file.find('/') != std::string::npos)
          broken("shard record");
      return 1;
    }
    // Version 3: the writers only, in rank order, and an index whose pieces
    // lie in listed shards, inside their data, and cover every tensor.
    if (m.shards.size() > static_cast<size_t>(m.world_size)) broken("shard count");
    std::map<int, uint64_t> data;
    for (size_t i = 0; i < m.shards.size(); ++i) {
      const ckpt::ShardRecord& s = m.shards[i];
      if (s.rank < 0 || s.rank >= m.world_size || (i > 0 && s.rank <= m.shards[i - 1].rank) ||
          s.file.find('/') != std::string::npos)
        broken("shard record");
      data[s.rank] = s.data_bytes;
    }
    for (const auto& kv : m.tensors) {
      for (const ckpt::IndexPiece& p : kv.second.pieces) {
        auto it = data.find(p.shard);
        if (it == data.end() || p.begin > p.end || p.end > it->second)
          broken("index piece outside the listed shards' data");
        if (ckpt::checked_numel(p.placement.local_shape, "fuzz") * dtype_size(kv.second.dtype) !=
            p.end - p.begin)
          broken("index piece: dtype x shape != bytes");
      }
      uint64_t gap = 0;
      if (ckpt::uncovered_elements(kv.second, &gap) != 0) broken("index leaves a tensor uncovered");
    }
    return 1;
  } catch (const Error& e) {
    expect_corrupt(e);
    return 0;
  }
}

}  // namespace fuzz
}  // namespace tutti
