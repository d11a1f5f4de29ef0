#include "checkpoint/shard_geometry.h"

#include <algorithm>

#include "checkpoint/safetensors.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

NamedTensor per_rank_as_stored(const NamedTensor& nt, int rank, int world) {
  if (!nt.shard.per_rank) return nt;
  const Shape& local = nt.tensor.shape();
  TUTTI_ARG_CHECK(nt.shard.global_shape.empty() && nt.shard.dim < 0 && !nt.shard.flat,
                  "tensor '", nt.name, "' is per-rank (ShardInfo::per_rank) but also sets ",
                  "global_shape, dim or flat; the checkpoint places per-rank rows itself");
  TUTTI_ARG_CHECK(local.ndim() < Shape::kMaxDims, "per-rank tensor '", nt.name, "' ",
                  local.str(), " has ", local.ndim(), " dimensions; the stored [world, ...] ",
                  "tensor allows at most ", Shape::kMaxDims - 1);
  std::vector<int64_t> dims = local.vec();
  dims.insert(dims.begin(), 1);
  NamedTensor out = nt;
  out.tensor = Tensor(nt.tensor.data(), nt.tensor.dtype(), Shape(dims), nt.tensor.device());
  dims[0] = world;
  out.shard.global_shape = dims;
  out.shard.dim = 0;
  out.shard.offset = rank;
  return out;
}

void per_rank_as_stored(StateDict* state, int rank, int world) {
  for (NamedTensor& nt : *state)
    if (nt.shard.per_rank) nt = per_rank_as_stored(nt, rank, world);
}

Placement make_placement(const std::vector<int64_t>& local_shape,
                         const ShardInfo& info, ErrorCode code,
                         const std::string& what) {
  auto fail = [&](const std::string& msg) {
    detail::throw_error(code, __FILE__, __LINE__,
                        detail::cat("'", what, "': ", msg));
  };
  Placement p;
  p.local_shape = local_shape;
  p.global_shape = info.global_shape.empty() ? local_shape : info.global_shape;
  p.flat = info.flat;
  p.dim = info.flat ? -1 : info.dim;
  p.offset = info.offset;
  const uint64_t local_n = checked_numel(local_shape, what);
  const uint64_t global_n = checked_numel(p.global_shape, what);
  if (p.global_shape.size() > static_cast<size_t>(Shape::kMaxDims))
    fail(detail::cat("global shape ", shape_str(p.global_shape), " has more than ",
                     Shape::kMaxDims, " dimensions"));
  if (info.flat) {
    if (info.offset < 0 || static_cast<uint64_t>(info.offset) > global_n ||
        local_n > global_n - static_cast<uint64_t>(info.offset))
      fail(detail::cat("flat shard [", info.offset, ", ", info.offset, " + ",
                       local_n, ") lies outside the global tensor ",
                       shape_str(p.global_shape), " of ", global_n, " elements"));
    return p;
  }
  if (info.dim < -1)
    fail(detail::cat("ShardInfo.dim = ", info.dim, " (expected -1 or a dimension)"));
  if (info.dim == -1) {
    if (p.global_shape != local_shape)
      fail(detail::cat("replicated tensor of shape ", shape_str(local_shape),
                       " declares the global shape ", shape_str(p.global_shape),
                       " (set ShardInfo.dim or flat for a shard)"));
    p.offset = 0;
    return p;
  }
  const size_t d = static_cast<size_t>(info.dim);
  if (d >= local_shape.size() || local_shape.size() != p.global_shape.size())
    fail(detail::cat("split along dim ", info.dim, " of local shape ",
                     shape_str(local_shape), " into global shape ",
                     shape_str(p.global_shape), ": ranks differ or dim is out of range"));
  for (size_t i = 0; i < local_shape.size(); ++i)
    if (i != d && local_shape[i] != p.global_shape[i])
      fail(detail::cat("split along dim ", info.dim, ": local shape ",
                       shape_str(local_shape), " and global shape ",
                       shape_str(p.global_shape), " differ in dim ", i));
  if (info.offset < 0 || info.offset > p.global_shape[d] ||
      local_shape[d] > p.global_shape[d] - info.offset)
    fail(detail::cat("slice [", info.offset, ", ", info.offset + local_shape[d],
                     ") of dim ", info.dim, " lies outside the global shape ",
                     shape_str(p.global_shape)));
  return p;
}

std::vector<Run> placement_runs(const Placement& p) {
  const uint64_t local_n = checked_numel(p.local_shape, "placement");
  if (local_n == 0) return {};
  if (p.flat) return {{static_cast<uint64_t>(p.offset), local_n}};
  if (p.dim < 0) return {{0, local_n}};
  const size_t d = static_cast<size_t>(p.dim);
  uint64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= static_cast<uint64_t>(p.global_shape[i]);
  for (size_t i = d + 1; i < p.global_shape.size(); ++i)
    inner *= static_cast<uint64_t>(p.global_shape[i]);
  const uint64_t gdim = static_cast<uint64_t>(p.global_shape[d]);
  const uint64_t len = static_cast<uint64_t>(p.local_shape[d]) * inner;
  std::vector<Run> runs;
  runs.reserve(outer);
  for (uint64_t o = 0; o < outer; ++o)
    runs.push_back({(o * gdim + static_cast<uint64_t>(p.offset)) * inner, len});
  return runs;
}

std::vector<Run> IntervalSet::add(uint64_t b, uint64_t e) {
  std::vector<Run> fresh;
  if (b >= e) return fresh;
  // Walk the spans that touch [b, e), emitting the gaps between them.
  auto it = spans_.upper_bound(b);
  if (it != spans_.begin()) {
    auto prev = std::prev(it);
    if (prev->second > b) it = prev;
  }
  uint64_t cur = b, nb = b, ne = e;
  while (it != spans_.end() && it->first <= e) {
    if (it->first > cur) fresh.push_back({cur, it->first - cur});
    cur = std::max(cur, it->second);
    nb = std::min(nb, it->first);
    ne = std::max(ne, it->second);
    total_ -= it->second - it->first;
    it = spans_.erase(it);
  }
  if (cur < e) fresh.push_back({cur, e - cur});
  spans_[nb] = ne;
  total_ += ne - nb;
  return fresh;
}

Run IntervalSet::first_gap(uint64_t n) const {
  uint64_t cur = 0;
  for (const auto& s : spans_) {
    if (s.first > cur) return {cur, std::min(s.first, n) - cur};
    cur = std::max(cur, s.second);
    if (cur >= n) break;
  }
  if (cur < n) return {cur, n - cur};
  return {n, 0};
}

std::vector<CopyRange> plan_copies(const std::vector<Run>& src,
                                   const std::vector<Run>& dst,
                                   IntervalSet& covered) {
  // Global ranges overlapping: sweep both run lists (each sorted by global
  // index, since row-major order is preserved by every placement).
  std::vector<CopyRange> out;
  size_t i = 0, j = 0;
  uint64_t src_local = 0, dst_local = 0;  // local index of run i / run j
  while (i < src.size() && j < dst.size()) {
    const Run& a = src[i];
    const Run& b = dst[j];
    const uint64_t lo = std::max(a.begin, b.begin);
    const uint64_t hi = std::min(a.begin + a.len, b.begin + b.len);
    if (lo < hi) {
      for (const Run& fresh : covered.add(lo, hi)) {
        CopyRange r{src_local + (fresh.begin - a.begin),
                    dst_local + (fresh.begin - b.begin), fresh.len};
        if (!out.empty() && out.back().src + out.back().len == r.src &&
            out.back().dst + out.back().len == r.dst)
          out.back().len += r.len;
        else
          out.push_back(r);
      }
    }
    if (a.begin + a.len <= b.begin + b.len) {
      src_local += a.len;
      ++i;
    } else {
      dst_local += b.len;
      ++j;
    }
  }
  std::sort(out.begin(), out.end(),
            [](const CopyRange& x, const CopyRange& y) { return x.src < y.src; });
  return out;
}

}  // namespace ckpt
}  // namespace tutti
