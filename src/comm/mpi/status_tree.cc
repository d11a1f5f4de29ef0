#include "comm/mpi/status_tree.h"

#include <algorithm>
#include <cstring>

namespace tutti {
namespace mpi {
namespace tree {

std::vector<Span> children(Span s, int fanout) {
  std::vector<Span> out;
  const int n = s.size() - 1;  // the members below this node
  if (n <= 0) return out;
  const int c = std::min(std::max(fanout, 1), n);
  const int q = n / c, r = n % c;
  int at = s.lo + 1;
  for (int i = 0; i < c; ++i) {
    const int len = q + (i < r ? 1 : 0);
    out.push_back({at, at + len});
    at += len;
  }
  return out;
}

int height(Span s, int fanout) {
  int h = 0;
  while (s.size() > 1) {
    s = children(s, fanout).front();  // the largest chunk
    ++h;
  }
  return h;
}

Where locate(int w, int index, int fanout) {
  Where at;
  at.self = {0, w};
  while (at.self.lo != index) {
    bool found = false;
    for (const Span& c : children(at.self, fanout)) {
      if (index >= c.lo && index < c.hi) {
        at.parent = at.self;
        at.self = c;
        found = true;
        break;
      }
    }
    if (!found) break;  // index outside [0, w): the caller checked it
  }
  return at;
}

std::vector<Run> encode_members(const std::vector<int>& r) {
  std::vector<Run> runs;
  for (size_t i = 0; i < r.size();) {
    Run run{r[i], 1, 1};
    if (i + 1 < r.size()) {
      run.stride = r[i + 1] - r[i];
      size_t j = i + 1;
      while (j < r.size() && r[j] - r[j - 1] == run.stride) ++j;
      run.count = static_cast<int32_t>(j - i);
    }
    runs.push_back(run);
    i += static_cast<size_t>(run.count);
  }
  return runs;
}

std::vector<int> decode_members(const std::vector<Run>& runs) {
  std::vector<int> out;
  for (const Run& run : runs)
    for (int32_t k = 0; k < run.count; ++k) out.push_back(run.first + k * run.stride);
  return out;
}

Class classify(const Answer& a, uint64_t seq) {
  if (!a.answered) return Class::kSilent;
  if (!a.member) return Class::kNotMember;
  if (a.entered == 0) return Class::kNotStarted;
  if (a.entered < seq) return Class::kBehind;
  return a.entered == seq ? Class::kAt : Class::kAhead;
}

namespace {

// What the report says of a rank does not depend on the fields below
// what it shows, so they are cleared: fewer groups.
Answer normalized(Answer a) {
  if (!a.answered) a.member = false;
  if (!a.member) a.entered = 0;
  if (a.entered == 0) {
    a.finished = false;
    a.kind = 0;
  }
  return a;
}

bool same_key(const Group& g, const Group& h) {
  return !g.mixed && !h.mixed && g.entered_hi == g.key.entered &&
         h.entered_hi == h.key.entered && g.key.answered == h.key.answered &&
         g.key.member == h.key.member && g.key.entered == h.key.entered &&
         g.key.finished == h.key.finished && g.key.kind == h.key.kind;
}

// The union of two ascending range lists, the lowest kMaxRanges kept.
comm::RankRanges unite(const comm::RankRanges& a, const comm::RankRanges& b) {
  comm::RankRanges all;
  all.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(all));
  comm::RankRanges out;
  for (const auto& r : all) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  if (out.size() > kMaxRanges) out.resize(kMaxRanges);
  return out;
}

uint64_t listed(const comm::RankRanges& r) {
  uint64_t n = 0;
  for (const auto& x : r) n += static_cast<uint64_t>(x.second - x.first + 1);
  return n;
}

// Wire layout of one group, followed by `nranges` (first, last) pairs.
struct WireGroup {
  uint64_t entered;
  uint64_t entered_hi;
  uint64_t count;
  uint16_t nranges;
  uint8_t flags;  // kAnswered | kMember | kFinished | kMixed
  uint8_t kind;
  uint32_t reserved;
};
static_assert(sizeof(WireGroup) == 32, "status group: 3 x uint64 + 8 bytes");
constexpr uint8_t kAnswered = 1, kMember = 2, kFinished = 4, kMixed = 8;

}  // namespace

void Aggregate::add_group(const Group& g) {
  if (g.count == 0) return;
  for (Group& h : groups_) {
    if (!same_key(g, h)) continue;
    h.ranges = unite(h.ranges, g.ranges);
    h.count += g.count;
    return;
  }
  groups_.push_back(g);
}

void Aggregate::add(int world_rank, const Answer& a) {
  Group g;
  g.key = normalized(a);
  g.entered_hi = g.key.entered;
  g.count = 1;
  g.ranges = {{world_rank, world_rank}};
  add_group(g);
}

void Aggregate::add_silent(const std::vector<int>& ranks) {
  if (ranks.empty()) return;
  Group g;
  g.count = ranks.size();
  g.ranges = comm::to_ranges(ranks);
  if (g.ranges.size() > kMaxRanges) g.ranges.resize(kMaxRanges);
  add_group(g);
}

void Aggregate::merge(const Aggregate& other) {
  for (const Group& g : other.groups_) add_group(g);
}

void Aggregate::cap(uint64_t seq) {
  while (groups_.size() > kMaxGroups) {
    // Fold the two smallest groups of one class (six classes: two of the
    // 65+ groups always share one).
    size_t best_a = 0, best_b = 0;
    uint64_t best = UINT64_MAX;
    for (size_t a = 0; a < groups_.size(); ++a)
      for (size_t b = a + 1; b < groups_.size(); ++b) {
        if (classify(groups_[a].key, seq) != classify(groups_[b].key, seq)) continue;
        const uint64_t n = groups_[a].count + groups_[b].count;
        if (n < best) {
          best = n;
          best_a = a;
          best_b = b;
        }
      }
    Group& a = groups_[best_a];
    const Group& b = groups_[best_b];
    a.mixed = a.mixed || b.mixed || a.key.kind != b.key.kind || a.key.finished != b.key.finished;
    a.entered_hi = std::max(a.entered_hi, b.entered_hi);
    a.key.entered = std::min(a.key.entered, b.key.entered);
    a.ranges = unite(a.ranges, b.ranges);
    a.count += b.count;
    groups_.erase(groups_.begin() + static_cast<std::ptrdiff_t>(best_b));
  }
}

void Aggregate::remove(int world_rank) {
  for (size_t i = 0; i < groups_.size(); ++i) {
    comm::RankRanges& r = groups_[i].ranges;
    for (size_t k = 0; k < r.size(); ++k) {
      if (world_rank < r[k].first || world_rank > r[k].second) continue;
      const auto x = r[k];
      r.erase(r.begin() + static_cast<std::ptrdiff_t>(k));
      if (world_rank < x.second) r.insert(r.begin() + static_cast<std::ptrdiff_t>(k), {world_rank + 1, x.second});
      if (world_rank > x.first) r.insert(r.begin() + static_cast<std::ptrdiff_t>(k), {x.first, world_rank - 1});
      if (--groups_[i].count == 0) groups_.erase(groups_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

uint64_t Aggregate::ranks() const {
  uint64_t n = 0;
  for (const Group& g : groups_) n += g.count;
  return n;
}

bool Aggregate::exact() const {
  for (const Group& g : groups_)
    if (listed(g.ranges) != g.count) return false;
  return true;
}

void Aggregate::serialize(std::vector<uint8_t>& out) const {
  const uint32_t n = static_cast<uint32_t>(groups_.size());
  const size_t at = out.size();
  out.resize(at + sizeof(n));
  std::memcpy(out.data() + at, &n, sizeof(n));
  for (const Group& g : groups_) {
    WireGroup w{};
    w.entered = g.key.entered;
    w.entered_hi = g.entered_hi;
    w.count = g.count;
    w.nranges = static_cast<uint16_t>(g.ranges.size());
    w.flags = static_cast<uint8_t>((g.key.answered ? kAnswered : 0) | (g.key.member ? kMember : 0) |
                                   (g.key.finished ? kFinished : 0) | (g.mixed ? kMixed : 0));
    w.kind = g.key.kind;
    const size_t p = out.size();
    out.resize(p + sizeof(w) + g.ranges.size() * 2 * sizeof(int32_t));
    std::memcpy(out.data() + p, &w, sizeof(w));
    int32_t* r = reinterpret_cast<int32_t*>(out.data() + p + sizeof(w));
    for (size_t k = 0; k < g.ranges.size(); ++k) {
      r[2 * k] = g.ranges[k].first;
      r[2 * k + 1] = g.ranges[k].second;
    }
  }
}

bool Aggregate::parse(const uint8_t* p, size_t n) {
  groups_.clear();
  uint32_t count = 0;
  if (n < sizeof(count)) return false;
  std::memcpy(&count, p, sizeof(count));
  size_t at = sizeof(count);
  if (count > 4 * kMaxGroups) return false;
  for (uint32_t i = 0; i < count; ++i) {
    WireGroup w;
    if (n - at < sizeof(w)) return false;
    std::memcpy(&w, p + at, sizeof(w));
    at += sizeof(w);
    const size_t rb = static_cast<size_t>(w.nranges) * 2 * sizeof(int32_t);
    if (n - at < rb) return false;
    Group g;
    g.key.answered = (w.flags & kAnswered) != 0;
    g.key.member = (w.flags & kMember) != 0;
    g.key.finished = (w.flags & kFinished) != 0;
    g.key.entered = w.entered;
    g.key.kind = w.kind;
    g.mixed = (w.flags & kMixed) != 0;
    g.entered_hi = w.entered_hi;
    g.count = w.count;
    for (size_t k = 0; k < w.nranges; ++k) {
      int32_t r[2];
      std::memcpy(r, p + at + k * sizeof(r), sizeof(r));
      g.ranges.emplace_back(r[0], r[1]);
    }
    at += rb;
    groups_.push_back(std::move(g));
  }
  return at == n;
}

}  // namespace tree
}  // namespace mpi
}  // namespace tutti
