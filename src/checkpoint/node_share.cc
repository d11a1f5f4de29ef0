#include "checkpoint/node_share.h"

#include <algorithm>
#include <map>

#include <xxhash.h>

#include "checkpoint/shard_reader.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

bool replicated_dst(const NamedTensor& nt) {
  return !nt.shard.per_rank && !nt.shard.flat && nt.shard.dim < 0;
}

struct SharedRef {
  const std::string* name;
  int shard;
  uint64_t begin;
  size_t item, source;
};

// Every shared source, in the order every rank of the node uses.
std::vector<SharedRef> shared_order(const LoadPlan& plan, const StateDict& dst) {
  std::vector<SharedRef> out;
  for (size_t i = 0; i < plan.items.size(); ++i)
    for (size_t k = 0; k < plan.items[i].sources.size(); ++k) {
      const PieceCopies& src = plan.items[i].sources[k];
      if (src.reader >= 0)
        out.push_back({&dst[plan.items[i].dst].name, src.shard, src.piece->begin, i, k});
    }
  std::sort(out.begin(), out.end(), [](const SharedRef& a, const SharedRef& b) {
    if (*a.name != *b.name) return *a.name < *b.name;
    return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
  });
  return out;
}

}  // namespace

bool agree_shareable(Agreement& node_agree, const StateDict& dst) {
  std::vector<const NamedTensor*> rep;
  for (const NamedTensor& nt : dst)
    if (replicated_dst(nt)) rep.push_back(&nt);
  std::sort(rep.begin(), rep.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  for (const NamedTensor* nt : rep) {
    XXH64_update(h, nt->name.data(), nt->name.size() + 1);
    const auto dtype = static_cast<uint64_t>(nt->tensor.dtype());
    XXH64_update(h, &dtype, sizeof dtype);
    const std::vector<int64_t> shape = nt->tensor.shape().vec();
    const uint64_t nd = shape.size();
    XXH64_update(h, &nd, sizeof nd);
    XXH64_update(h, shape.data(), shape.size() * sizeof(int64_t));
  }
  const auto f = static_cast<int64_t>(XXH64_digest(h));
  XXH64_freeState(h);
  const std::vector<int64_t> r = node_agree.allreduce_max({f, ~f}, "agreeing on shared reads");
  return r[0] == ~r[1];
}

void assign_node_reads(LoadPlan* plan, const OpenedCheckpoint& ckpt, const StateDict& dst,
                       const std::vector<int>& verifier, int node_size) {
  if (!ckpt.indexed || node_size < 2) return;
  for (PlanItem& item : plan->items) {
    if (item.resized >= 0 || !replicated_dst(dst[item.dst])) continue;
    auto t = ckpt.manifest.tensors.find(dst[item.dst].name);
    if (t == ckpt.manifest.tensors.end() || !stored_once(t->second)) continue;
    bool contiguous = true;
    for (const PieceCopies& src : item.sources) contiguous = contiguous && src.copies.size() == 1;
    if (!contiguous) continue;
    for (PieceCopies& src : item.sources) src.reader = 0;  // assigned below
  }
  // Bytes of shared pieces per shard, in shard order.
  std::map<int, uint64_t> shard_bytes;
  for (const SharedRef& ref : shared_order(*plan, dst)) {
    const PieceCopies& src = plan->items[ref.item].sources[ref.source];
    shard_bytes[src.shard] += src.copies[0].len * dtype_size(src.piece->dtype);
  }
  std::vector<uint64_t> load(static_cast<size_t>(node_size), 0);
  std::map<int, int> reader;
  for (const auto& kv : shard_bytes) {
    const int v = kv.first < static_cast<int>(verifier.size())
                      ? verifier[static_cast<size_t>(kv.first)] : -1;
    if (v < 0) continue;
    reader[kv.first] = v;
    load[static_cast<size_t>(v)] += kv.second;
  }
  for (const auto& kv : shard_bytes) {
    if (reader.count(kv.first)) continue;
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    reader[kv.first] = r;
    load[static_cast<size_t>(r)] += kv.second;
  }
  for (PlanItem& item : plan->items)
    for (PieceCopies& src : item.sources)
      if (src.reader >= 0) src.reader = reader.at(src.shard);
}

std::string execute_node_reads(const LoadPlan& plan, const StateDict& dst,
                               Agreement& node_agree, ShardFiles& files, HostBufferPool& pool) {
  std::string first_error;
  HostBuffer staging;  // CUDA destinations: every rank of the node stages
  for (const SharedRef& ref : shared_order(plan, dst)) {
    const PlanItem& item = plan.items[ref.item];
    const PieceCopies& src = item.sources[ref.source];
    const CopyRange& c = src.copies[0];
    const Tensor& d = dst[item.dst].tensor;
    const uint64_t es = dtype_size(src.piece->dtype);
    const uint64_t bytes = c.len * es;
    const bool reader = node_agree.rank() == src.reader;
    for (uint64_t done = 0; done < bytes; done += kShareChunk) {
      const uint64_t n = std::min(kShareChunk, bytes - done);
      unsigned char* buf;
      if (d.is_cuda()) {
        if (!staging.data()) staging = pool.acquire(static_cast<size_t>(kShareChunk));
        buf = staging.as<unsigned char>();
      } else {
        buf = static_cast<unsigned char*>(d.data()) + c.dst * es + done;
      }
      if (reader) {
        try {
          files.read(src.shard, buf, n, src.piece->begin + c.src * es + done);
        } catch (const Error& e) {
          if (first_error.empty()) first_error = e.message();
        }
      }
      node_agree.broadcast_bytes(buf, n, src.reader, "sharing replicated state within the node");
      if (d.is_cuda()) {
        try {
          copy_out(d, c.dst * es + done, buf, static_cast<size_t>(n));
        } catch (const Error& e) {
          if (first_error.empty()) first_error = e.message();
        }
      }
    }
  }
  pool.release(std::move(staging));
  return first_error;
}

}  // namespace ckpt
}  // namespace tutti
