// ShardedOptimizer: following the reducer's learned bucket order.  The
// reducer re-plans its buckets once, inside its first reducing
// synchronize() (ReducerOptions::learn_bucket_order); the shards are cut
// from the bucket layout, so the state built for the registration-order plan
// (or loaded into it from a checkpoint) moves to the new plan there.
//
// Both plans are known on every rank and shards are cut the same way (rank r
// owns elements [r*S, min((r+1)*S, N)) of a bucket of N, S = ceil(N/W)), so
// each rank computes on its own which pieces of its old shard belong to
// which rank's new shard, and which pieces of its new shard come from whom:
// the intersections (parameter, elements [begin, end), from, to).  Every
// pair of ranks exchanges one message (several past 1 GiB) holding their
// pieces in (parameter, begin) order: master weights, each optimizer state,
// and in stage 2 this step's averaged gradient.  A rank sends and receives
// only its own shard, O(model / W) bytes, where gathering every old bucket
// whole (what this did before) cost (2 + states) float32 copies of the model
// on every rank.  Pure data movement: the moved state is bit for bit the
// old one.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>

#include "core/check.h"
#include "core/cuda_utils.h"
#include "data_parallel/zero/zero_impl.h"
#include "tutti/log.h"

namespace tutti {

using zero::Bucket;

namespace {

// The last remap's cost (zero::last_remap_cost()).
std::atomic<uint64_t> g_sent{0}, g_received{0}, g_messages{0}, g_peers{0};

}  // namespace

namespace zero {

RemapCost last_remap_cost() {
  RemapCost c;
  c.bytes_sent = g_sent.load(std::memory_order_relaxed);
  c.bytes_received = g_received.load(std::memory_order_relaxed);
  c.messages_sent = g_messages.load(std::memory_order_relaxed);
  c.peers = g_peers.load(std::memory_order_relaxed);
  return c;
}

}  // namespace zero

namespace {

// Point-to-point messages of the remap on the reducer's group (one exchange
// per job, every rank inside the same synchronize()).
constexpr int kRemapTag = 29041;
// Messages are cut at 1 GiB (MPI counts are ints).
constexpr int64_t kMaxMessage = int64_t{1} << 30;

// Where a parameter lies in one plan.
struct Place {
  int bucket = -1;
  int64_t offset = 0;
};

// Elements [begin, end) of a parameter that move between this rank and `peer`.
struct Segment {
  int param;
  int64_t begin, end;
  bool operator<(const Segment& o) const {
    return param != o.param ? param < o.param : begin < o.begin;
  }
};

std::vector<Place> places(const std::vector<Bucket>& plan, size_t num_params) {
  std::vector<Place> at(num_params);
  for (size_t i = 0; i < plan.size(); ++i)
    for (size_t s = 0; s < plan[i].layout.slots.size(); ++s)
      at[static_cast<size_t>(plan[i].slot_params[s])] = {static_cast<int>(i),
                                                         plan[i].layout.slots[s].offset};
  return at;
}

// Splits elements [e0, e1) of a parameter lying at `offset` in a bucket cut
// into shards of `shard` elements by owning rank: f(owner, begin, end).
template <typename F>
void split_by_owner(int64_t offset, int64_t e0, int64_t e1, int64_t shard, F f) {
  for (int64_t e = e0; e < e1;) {
    const int64_t owner = (offset + e) / shard;
    const int64_t end = std::min(e1, (owner + 1) * shard - offset);
    f(static_cast<int>(owner), e, end);
    e = end;
  }
}

// One bucket's shard arrays on the host: master, each state, and (stage 2)
// the gradient shard.  CPU buckets are used in place; CUDA ones through
// host copies (staged before the exchange, uploaded after it).
struct HostShard {
  std::vector<uint8_t*> arrays;
  std::vector<size_t> elem;  // bytes per element of each array
  std::vector<std::vector<uint8_t>> copies;
  bool cuda = false;
};

HostShard host_shard(Bucket& z, bool with_grad, bool download) {
  HostShard h;
  std::vector<dp::FusionBuffer*> bufs{&z.master};
  for (auto& s : z.states) bufs.push_back(&s);
  if (with_grad) bufs.push_back(&z.grad);
  h.cuda = z.layout.device.is_cuda();
  for (dp::FusionBuffer* b : bufs) {
    const size_t es = dtype_size(b->view().dtype());
    h.elem.push_back(es);
    if (!h.cuda) {
      h.arrays.push_back(static_cast<uint8_t*>(b->data()));
      continue;
    }
    h.copies.emplace_back(static_cast<size_t>(z.owned) * es);
#if TUTTI_WITH_CUDA
    if (download && z.owned > 0)
      TUTTI_CUDA_CHECK(cudaMemcpy(h.copies.back().data(), b->data(), h.copies.back().size(),
                                  cudaMemcpyDeviceToHost));
#else
    (void)download;
#endif
    h.arrays.push_back(h.copies.back().data());
  }
  return h;
}

// Bytes one element of a parameter takes in a message (every array).
size_t element_bytes(const HostShard& h) {
  size_t n = 0;
  for (size_t es : h.elem) n += es;
  return n;
}

// Copies segment elements between a message and a shard: `local` is the
// segment's first element's index in the shard.
void pack(const HostShard& h, int64_t local, int64_t n, uint8_t*& msg, bool into_message) {
  for (size_t j = 0; j < h.arrays.size(); ++j) {
    uint8_t* a = h.arrays[j] + static_cast<size_t>(local) * h.elem[j];
    const size_t bytes = static_cast<size_t>(n) * h.elem[j];
    if (into_message)
      std::memcpy(msg, a, bytes);
    else
      std::memcpy(a, msg, bytes);
    msg += bytes;
  }
}

}  // namespace

void ShardedOptimizerImpl::remap() {
  wait_parameters();  // no all-gather may still write the old buffers
#if TUTTI_WITH_CUDA
  // Once per job: every write into the old shards (casts, a loaded
  // checkpoint, stage 2's reduce-scatter) has landed before they are read.
  if (!buckets_.empty() && buckets_.front().layout.device.is_cuda()) {
    cuda::DeviceGuard g(buckets_.front().layout.device.index);
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  const bool grad = opt_.stage == 2;
  std::vector<Bucket> old;
  old.swap(buckets_);
  std::vector<HostShard> from;
  for (Bucket& z : old) from.push_back(host_shard(z, grad, /*download=*/true));
  build_layout();
  std::vector<HostShard> to;
  for (Bucket& z : buckets_) to.push_back(host_shard(z, grad, /*download=*/false));
  const size_t num_params = static_cast<size_t>(reducer_.num_parameters());
  const std::vector<Place> was = places(old, num_params), now = places(buckets_, num_params);
  for (const Bucket& z : buckets_)
    for (size_t s = 0; s < z.slot_params.size(); ++s)
      TUTTI_CHECK(was[static_cast<size_t>(z.slot_params[s])].bucket >= 0, "ShardedOptimizer '",
                  opt_.name, "': parameter '", z.layout.slots[s].name,
                  "' is in no bucket of the previous plan");

  // What goes to whom: this rank's old pieces cut by the new shards, and
  // where this rank's new pieces come from: old pieces cut by the old shards.
  std::map<int, std::vector<Segment>> sends, recvs;
  for (const Bucket& z : old)
    for (const zero::Piece& p : z.pieces) {
      const Place& n = now[static_cast<size_t>(p.param)];
      const Bucket& nz = buckets_[static_cast<size_t>(n.bucket)];
      split_by_owner(n.offset, p.param_offset, p.param_offset + (p.end - p.begin),
                     nz.shard.shard_numel,
                     [&](int to_rank, int64_t b, int64_t e) { sends[to_rank].push_back({p.param, b, e}); });
    }
  for (const Bucket& z : buckets_)
    for (const zero::Piece& p : z.pieces) {
      const Place& w = was[static_cast<size_t>(p.param)];
      const Bucket& oz = old[static_cast<size_t>(w.bucket)];
      split_by_owner(w.offset, p.param_offset, p.param_offset + (p.end - p.begin),
                     oz.shard.shard_numel,
                     [&](int from_rank, int64_t b, int64_t e) { recvs[from_rank].push_back({p.param, b, e}); });
    }
  // One order on both sides of a pair.
  for (auto& s : sends) std::sort(s.second.begin(), s.second.end());
  for (auto& s : recvs) std::sort(s.second.begin(), s.second.end());

  // A segment's place in the old and the new shard.
  const auto old_local = [&](const Segment& s) {
    const Place& w = was[static_cast<size_t>(s.param)];
    return std::make_pair(static_cast<size_t>(w.bucket),
                          w.offset + s.begin - old[static_cast<size_t>(w.bucket)].shard.begin);
  };
  const auto new_local = [&](const Segment& s) {
    const Place& n = now[static_cast<size_t>(s.param)];
    return std::make_pair(static_cast<size_t>(n.bucket),
                          n.offset + s.begin - buckets_[static_cast<size_t>(n.bucket)].shard.begin);
  };
  const auto message_bytes = [&](const std::vector<Segment>& segs) {
    size_t n = 0;
    for (const Segment& s : segs)
      n += static_cast<size_t>(s.end - s.begin) * element_bytes(to[new_local(s).first]);
    return n;
  };

  // This rank's own pieces move in place; the others travel.
  auto self_send = sends.find(rank_);
  if (self_send != sends.end()) {
    for (const Segment& s : self_send->second) {
      std::vector<uint8_t> tmp(static_cast<size_t>(s.end - s.begin) *
                               element_bytes(from[old_local(s).first]));
      uint8_t* m = tmp.data();
      pack(from[old_local(s).first], old_local(s).second, s.end - s.begin, m, true);
      m = tmp.data();
      pack(to[new_local(s).first], new_local(s).second, s.end - s.begin, m, false);
    }
    sends.erase(self_send);
    recvs.erase(rank_);
  }
  std::vector<std::pair<int, std::vector<uint8_t>>> in, out;
  std::vector<WorkPtr> works;
  OpOptions o;
  o.name = opt_.name + " remap";
  uint64_t sent = 0, received = 0, messages = 0;
  const auto post = [&](int peer, std::vector<uint8_t>& buf, bool send) {
    for (int64_t at = 0; at < static_cast<int64_t>(buf.size()); at += kMaxMessage) {
      const int64_t n = std::min<int64_t>(kMaxMessage, static_cast<int64_t>(buf.size()) - at);
      const Tensor t(buf.data() + at, DType::kUInt8, Shape{n});
      works.push_back(send ? reducer_.group()->send_async(t, peer, kRemapTag, o)
                           : reducer_.group()->recv_async(t, peer, kRemapTag, o));
      messages += send ? 1 : 0;
    }
  };
  for (auto& r : recvs) {
    in.emplace_back(r.first, std::vector<uint8_t>(message_bytes(r.second)));
    received += in.back().second.size();
  }
  for (auto& s : sends) {
    out.emplace_back(s.first, std::vector<uint8_t>(message_bytes(s.second)));
    uint8_t* m = out.back().second.data();
    for (const Segment& seg : s.second)
      pack(from[old_local(seg).first], old_local(seg).second, seg.end - seg.begin, m, true);
    sent += out.back().second.size();
  }
  // Receives first: a peer's send finds its receive posted.
  for (auto& r : in) post(r.first, r.second, false);
  for (auto& s : out) post(s.first, s.second, true);
  for (const WorkPtr& w : works) w->wait();
  for (auto& r : in) {
    uint8_t* m = r.second.data();
    for (const Segment& seg : recvs[r.first])
      pack(to[new_local(seg).first], new_local(seg).second, seg.end - seg.begin, m, false);
  }
  g_sent.store(sent, std::memory_order_relaxed);
  g_messages.store(messages, std::memory_order_relaxed);
  g_received.store(received, std::memory_order_relaxed);
  g_peers.store(std::max(sends.size(), recvs.size()), std::memory_order_relaxed);

#if TUTTI_WITH_CUDA
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (!to[i].cuda) continue;
    Bucket& z = buckets_[i];
    cuda::DeviceGuard g(z.layout.device.index);
    std::vector<dp::FusionBuffer*> bufs{&z.master};
    for (auto& s : z.states) bufs.push_back(&s);
    if (grad) bufs.push_back(&z.grad);
    for (size_t j = 0; j < bufs.size(); ++j)
      cuda::copy_to_device_sync(bufs[j]->data(), to[i].copies[j].data(), to[i].copies[j].size());
  }
#endif
  TUTTI_LOG(kInfo) << "ShardedOptimizer '" << opt_.name << "': moved the shards onto the "
                   << buckets_.size() << " buckets of the learned order (from " << old.size()
                   << "; sent " << sent << " bytes to " << sends.size() << " ranks, received "
                   << received << " from " << recvs.size() << ")";
}

}  // namespace tutti
