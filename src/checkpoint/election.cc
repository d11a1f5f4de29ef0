#include "checkpoint/election.h"

#include <algorithm>
#include <climits>

#include <xxhash.h>

#include "checkpoint/safetensors.h"
#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace ckpt {
namespace {

constexpr int64_t kNone = INT64_MIN;  // a non-holder's word: MAX's identity
constexpr int kRankBits = 24;         // manifests allow at most 2^24 ranks
constexpr int64_t kRankMask = (int64_t{1} << kRankBits) - 1;

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool agreed(int64_t h, int64_t not_h) { return h == ~not_h; }

// A holder exists when some rank contributed something other than kNone.
bool held(int64_t h, int64_t not_h) { return h != kNone || not_h != kNone; }

uint64_t boundary(uint64_t k, uint64_t total, uint64_t ranges) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(k) * total / ranges);
}

bool empty_piece_of_nonempty(const Placement& p) {
  uint64_t local = 1, global = 1;
  for (int64_t d : p.local_shape) local *= static_cast<uint64_t>(d);
  for (int64_t d : p.global_shape) global *= static_cast<uint64_t>(d);
  return local == 0 && global != 0;
}

}  // namespace

int64_t election_key(const std::string& name, int64_t part, int rank) {
  const uint64_t h = mix64(XXH64(name.data(), name.size(), 0) ^
                           (static_cast<uint64_t>(part) * 0x9e3779b97f4a7c15ull));
  return static_cast<int64_t>((h >> (kRankBits + 2)) << kRankBits) | rank;
}

std::vector<StreamCut> cut_stream(const std::vector<uint64_t>& bytes,
                                  const std::vector<uint64_t>& elem, int world,
                                  uint64_t chunk_bytes) {
  TUTTI_CHECK(bytes.size() == elem.size() && world >= 1 && chunk_bytes > 0);
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  std::vector<StreamCut> cuts;
  if (total == 0) return cuts;
  const uint64_t ranges =
      std::max<uint64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(world), total / chunk_bytes));
  uint64_t start = 0;
  for (size_t t = 0; t < bytes.size(); start += bytes[t], ++t) {
    const uint64_t n = bytes[t], e = elem[t];
    if (n == 0) continue;
    // The element of tensor t at which stream byte b falls (whole elements:
    // a boundary inside an element moves to its start, for both neighbours).
    auto cut_elem = [&](uint64_t b) -> uint64_t {
      if (b <= start) return 0;
      if (b >= start + n) return n / e;
      return (b - start) / e;
    };
    uint64_t k = static_cast<uint64_t>(static_cast<unsigned __int128>(start) * ranges / total);
    while (k + 1 < ranges && boundary(k + 1, total, ranges) <= start) ++k;
    while (k > 0 && boundary(k, total, ranges) > start) --k;
    for (; k < ranges && boundary(k, total, ranges) < start + n; ++k) {
      const uint64_t first = cut_elem(boundary(k, total, ranges));
      const uint64_t last = cut_elem(boundary(k + 1, total, ranges));
      if (last <= first) continue;
      StreamCut c;
      c.tensor = t;
      c.writer = static_cast<int>(k * static_cast<uint64_t>(world) / ranges);
      c.first = first;
      c.count = last - first;
      cuts.push_back(c);
    }
  }
  return cuts;
}

Election::Election(const StateDict& state, const std::vector<Placement>& placements,
                   const ElectionConfig& cfg, int rank, int world)
    : state_(state), placements_(placements), cfg_(cfg), rank_(rank), world_(world) {
  TUTTI_CHECK(state.size() == placements.size());
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  auto feed = [&](const void* p, size_t n) { XXH64_update(h, p, n); };
  auto feed_u64 = [&](uint64_t v) { feed(&v, sizeof v); };
  feed_u64(cfg_.once ? 1 : 2);
  if (cfg_.once) {
    feed_u64(cfg_.chunk_bytes);
    feed_u64(static_cast<uint64_t>(cfg_.check));
    for (size_t i = 0; i < state.size(); ++i) {
      const Placement& p = placements[i];
      if (state[i].shard.per_rank || p.flat) continue;
      SlotEntry c;
      c.src = i;
      if (!p.replicated()) {
        const size_t d = static_cast<size_t>(p.dim);
        const int64_t g = p.global_shape[d], l = p.local_shape[d];
        const bool even = l > 0 && g % l == 0 && p.offset % l == 0;
        c.parts = even ? g / l : 0;
        c.part = even ? p.offset / l : 0;
      }
      catalog_.push_back(c);
    }
    std::sort(catalog_.begin(), catalog_.end(), [&](const SlotEntry& a, const SlotEntry& b) {
      return state[a.src].name < state[b.src].name;
    });
    for (const SlotEntry& c : catalog_) {
      const Placement& p = placements[c.src];
      const std::string& name = state[c.src].name;
      feed(name.data(), name.size() + 1);  // with its NUL: names cannot run together
      feed_u64(static_cast<uint64_t>(state[c.src].tensor.dtype()));
      feed_u64(p.global_shape.size());
      for (int64_t d : p.global_shape) feed_u64(static_cast<uint64_t>(d));
      feed_u64(static_cast<uint64_t>(p.dim));
      feed_u64(static_cast<uint64_t>(c.parts));
      words_ += p.replicated() ? 2 : 3 * static_cast<size_t>(c.parts);
    }
  }
  fingerprint_ = XXH64_digest(h);
  XXH64_freeState(h);
}

std::vector<int64_t> Election::catalog_words(bool invalid) const {
  const auto f = static_cast<int64_t>(fingerprint_);
  const auto n = static_cast<int64_t>(words_);
  return {invalid ? 1 : 0, f, ~f, n, ~n};
}

bool Election::catalogs_agree(const std::vector<int64_t>& r) const {
  TUTTI_CHECK(r.size() == 5, "catalog agreement of ", r.size(), " words");
  return agreed(r[1], r[2]) && agreed(r[3], r[4]);
}

std::vector<size_t> Election::digest_sources() const {
  std::vector<size_t> out;
  for (const SlotEntry& c : catalog_)
    if (c.parts > 0) out.push_back(c.src);
  return out;
}

std::vector<int64_t> Election::slot_words(const std::vector<uint64_t>& digests) const {
  std::vector<int64_t> w;
  w.reserve(words_);
  size_t k = 0;
  for (const SlotEntry& c : catalog_) {
    if (c.parts == 0) continue;
    TUTTI_CHECK(k < digests.size(), "slot_words: ", digests.size(), " digests");
    const auto h = static_cast<int64_t>(digests[k++]);
    if (placements_[c.src].replicated()) {
      w.push_back(h);
      w.push_back(~h);
      continue;
    }
    for (int64_t p = 0; p < c.parts; ++p) {
      if (p != c.part) {
        w.insert(w.end(), {kNone, kNone, kNone});
        continue;
      }
      w.push_back(h);
      w.push_back(~h);
      w.push_back(~election_key(state_[c.src].name, p, rank_));
    }
  }
  TUTTI_CHECK(w.size() == words_, "slot_words: ", w.size(), " words, expected ", words_);
  return w;
}

std::vector<WriteItem> Election::decide(const std::vector<int64_t>& reduced) {
  std::vector<WriteItem> items;
  auto whole = [&](size_t i) {
    WriteItem it;
    it.src = i;
    it.count = static_cast<uint64_t>(state_[i].tensor.numel());
    it.placement = placements_[i];
    items.push_back(std::move(it));
  };
  if (!cfg_.once || (reduced.empty() && words_ > 0) || !fallback_.empty()) {
    for (size_t i = 0; i < state_.size(); ++i) whole(i);  // the per-rank layout
    return items;
  }
  TUTTI_CHECK(reduced.size() == words_, "layout election: ", reduced.size(),
              " reduced words, expected ", words_);
  std::vector<bool> in_catalog(state_.size(), false);
  std::vector<size_t> stream;  // replicated tensors written once, catalog order
  size_t w = 0;
  for (const SlotEntry& c : catalog_) {
    in_catalog[c.src] = true;
    const Placement& p = placements_[c.src];
    const std::string& name = state_[c.src].name;
    if (c.parts == 0) {  // uneven: every holder writes its piece
      if (!empty_piece_of_nonempty(p)) whole(c.src);
      continue;
    }
    if (p.replicated()) {
      if (agreed(reduced[w], reduced[w + 1])) {
        stream.push_back(c.src);
      } else {
        divergent_.push_back(name);
        whole(c.src);
      }
      w += 2;
      continue;
    }
    bool differs = false;
    for (int64_t part = 0; part < c.parts; ++part, w += 3) {
      const int64_t h = reduced[w], nh = reduced[w + 1];
      if (!held(h, nh)) continue;  // nobody holds it: rank 0's coverage check names it
      const bool same = agreed(h, nh);
      differs = differs || !same;
      if (part != c.part) continue;
      const int winner = static_cast<int>(~reduced[w + 2] & kRankMask);
      if (!same || winner == rank_) whole(c.src);
    }
    if (differs) divergent_.push_back(name);
  }
  for (size_t i = 0; i < state_.size(); ++i)
    if (!in_catalog[i] && !empty_piece_of_nonempty(placements_[i])) whole(i);
  // Empty replicated tensors have no bytes to cut: rank 0 writes them, so
  // that every tensor of the checkpoint lies in some shard.
  if (rank_ == 0)
    for (size_t i : stream)
      if (state_[i].tensor.numel() == 0) whole(i);
  std::vector<uint64_t> bytes, elem;
  for (size_t i : stream) {
    bytes.push_back(state_[i].tensor.nbytes());
    elem.push_back(state_[i].tensor.element_size());
  }
  for (const StreamCut& cut : cut_stream(bytes, elem, world_, cfg_.chunk_bytes)) {
    if (cut.writer != rank_) continue;
    const size_t i = stream[cut.tensor];
    const Placement& p = placements_[i];
    WriteItem it;
    it.src = i;
    it.first = cut.first;
    it.count = cut.count;
    it.placement = p;
    if (cut.count != static_cast<uint64_t>(state_[i].tensor.numel())) {
      // A chunk of a replicated tensor: a flat piece of the global tensor.
      it.placement.local_shape = {static_cast<int64_t>(cut.count)};
      it.placement.flat = true;
      it.placement.dim = -1;
      it.placement.offset = static_cast<int64_t>(cut.first);
    }
    items.push_back(std::move(it));
  }
  std::sort(items.begin(), items.end(), [](const WriteItem& a, const WriteItem& b) {
    return a.src != b.src ? a.src < b.src : a.first < b.first;
  });
  return items;
}

ElectionConfig election_config(CheckpointLayout requested) {
  ElectionConfig c;
  if (requested == CheckpointLayout::kFromSetting) {
    const std::string v = config::get_string("TUTTI_CKPT_LAYOUT");
    TUTTI_ARG_CHECK(v == "once" || v == "per-rank", "TUTTI_CKPT_LAYOUT='", v,
                    "' (expected once or per-rank)");
    c.once = v == "once";
  } else {
    c.once = requested == CheckpointLayout::kOnce;
  }
  const int64_t mb = config::get_int("TUTTI_CKPT_CHUNK_MB");
  TUTTI_ARG_CHECK(mb >= 1 && mb <= (int64_t{1} << 20), "TUTTI_CKPT_CHUNK_MB=", mb,
                  " (expected 1 .. 1048576)");
  c.chunk_bytes = static_cast<uint64_t>(mb) << 20;
  const std::string check = config::get_string("TUTTI_CKPT_VERIFY_REPLICAS");
  TUTTI_ARG_CHECK(check == "sample" || check == "full", "TUTTI_CKPT_VERIFY_REPLICAS='", check,
                  "' (expected sample or full)");
  c.check = check == "full" ? ReplicaCheck::kFull : ReplicaCheck::kSample;
  return c;
}

}  // namespace ckpt
}  // namespace tutti
