// The texts of stall warnings and timeout errors (status_service.h): from
// one answer per peer (describe_stall, describe_stragglers: the wording
// every report has had) or from the status tree's aggregate
// (describe_report), which keeps that wording up to TUTTI_REPORT_MAX_RANKS
// peers and names ranges and groups of ranks above it.
#include <algorithm>
#include <map>
#include <sstream>

#include "comm/mpi/status_service.h"
#include "comm/op_desc.h"
#include "tutti/comm.h"

namespace tutti {
namespace mpi {
namespace {

using tree::Class;
using tree::Group;

// CommProgress::kind: a CollectiveKind or one of the split kinds.
const char* kind_name(uint8_t kind) {
  if (kind == comm::kSplitKind) return "split";
  if (kind == comm::kSplitSharedKind) return "node split";
  if (kind == comm::kJoinKind) return "join";
  return collective_kind_name(static_cast<CollectiveKind>(kind));
}

// " (last entered #4 barrier, finished it)" for a peer that did not reach
// the op.
std::string where_is(const PeerStatus& p) {
  std::ostringstream os;
  if (!p.member)
    os << " (has no such communicator)";
  else if (p.entered == 0)
    os << " (has not started any operation)";
  else
    os << " (last entered #" << p.entered << " " << kind_name(p.kind)
       << (p.completed >= p.entered ? ", finished it" : ", still in it") << ")";
  return os.str();
}

constexpr const char* kSilentWhy = "dead, or stuck outside tutti";

// The same for a group of the aggregate.
std::string where_is(const Group& g) {
  if (!g.key.answered) return std::string(" (did not answer: ") + kSilentWhy + ")";
  if (g.mixed || g.entered_hi != g.key.entered) {
    std::ostringstream os;
    os << " (last entered ops #" << g.key.entered << " to #" << g.entered_hi << ")";
    return os.str();
  }
  PeerStatus p;
  p.member = g.key.member;
  p.entered = g.key.entered;
  p.completed = g.key.finished ? g.key.entered : g.key.entered - 1;
  p.kind = g.key.kind;
  return where_is(p);
}

// The union of `groups`' ranks: ranges and exact count.
struct Ranks {
  comm::RankRanges ranges;
  uint64_t count = 0;
  void add(const Group& g) {
    comm::RankRanges all = ranges;
    all.insert(all.end(), g.ranges.begin(), g.ranges.end());
    std::sort(all.begin(), all.end());
    ranges.clear();
    for (const auto& r : all) {
      if (!ranges.empty() && r.first <= ranges.back().second + 1)
        ranges.back().second = std::max(ranges.back().second, r.second);
      else
        ranges.push_back(r);
    }
    count += g.count;
  }
  std::string str(int max_ranks) const { return comm::format_ranks(ranges, count, max_ranks); }
};

int first_rank(const Group& g) { return g.ranges.empty() ? INT32_MAX : g.ranges.front().first; }

// "ranks 900-1023 (last entered #2 barrier, finished it); rank 5 (...)",
// at most max_ranks groups, lowest ranks first, then what is left counted.
std::string list_groups(std::vector<const Group*> gs, int max_ranks, bool ahead) {
  std::sort(gs.begin(), gs.end(),
            [](const Group* a, const Group* b) { return first_rank(*a) < first_rank(*b); });
  std::ostringstream os;
  uint64_t more = 0;
  size_t more_groups = 0;
  for (size_t i = 0; i < gs.size(); ++i) {
    const Group& g = *gs[i];
    if (i >= static_cast<size_t>(max_ranks)) {
      more += g.count;
      ++more_groups;
      continue;
    }
    os << (i ? "; " : "") << comm::format_ranks(g.ranges, g.count, max_ranks);
    if (!ahead)
      os << where_is(g);
    else if (g.entered_hi != g.key.entered)
      os << " (at #" << g.key.entered << " to #" << g.entered_hi << ")";
    else
      os << " (at #" << g.key.entered << ")";
  }
  if (more)
    os << "; and " << more << (more == 1 ? " more rank" : " more ranks") << " in "
       << more_groups << (more_groups == 1 ? " more place" : " more places");
  return os.str();
}

// One answer per peer, in `peers`' order, from an exact aggregate.
std::vector<PeerStatus> expand(const tree::Aggregate& a, const std::vector<int>& peers) {
  std::map<int, const Group*> of;
  for (const Group& g : a.groups())
    for (const auto& r : g.ranges)
      for (int k = r.first; k <= r.second; ++k) of[k] = &g;
  std::vector<PeerStatus> out;
  for (int peer : peers) {
    PeerStatus p;
    p.world_rank = peer;
    auto it = of.find(peer);
    if (it != of.end()) {
      const Group& g = *it->second;
      p.answered = g.key.answered;
      p.member = g.key.member;
      p.entered = g.key.entered;
      p.completed = g.key.finished ? g.key.entered : g.key.entered - 1;
      p.kind = g.key.kind;
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace

std::string describe_stall(const std::vector<PeerStatus>& peers, uint64_t seq, int self) {
  std::vector<int> arrived{self};
  std::ostringstream missing;
  int n_missing = 0;
  for (const auto& p : peers) {
    if (p.answered && p.member && p.entered >= seq) {
      arrived.push_back(p.world_rank);
      continue;
    }
    missing << (n_missing++ ? "; " : "") << "rank " << p.world_rank
            << (p.answered ? where_is(p) : std::string(" (did not answer: ") + kSilentWhy + ")");
  }
  std::sort(arrived.begin(), arrived.end());
  std::ostringstream os;
  os << "arrived: " << (arrived.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < arrived.size(); ++i) os << (i ? ", " : "") << arrived[i];
  if (n_missing)
    os << "; missing: " << missing.str();
  else
    os << "; missing: none (every rank entered this op: the transport has "
          "not completed it yet)";
  return os.str();
}

std::string describe_stragglers(const std::vector<PeerStatus>& peers, uint64_t seq) {
  std::ostringstream never, ahead, silent, arrived;
  int n_never = 0, n_ahead = 0, n_silent = 0, n_arrived = 0;
  for (const auto& p : peers) {
    if (!p.answered) {
      silent << (n_silent++ ? ", " : "") << p.world_rank;
    } else if (!p.member || p.entered < seq) {
      never << (n_never++ ? "; " : "") << "rank " << p.world_rank << where_is(p);
    } else if (p.entered > seq) {
      ahead << (n_ahead++ ? "; " : "") << "rank " << p.world_rank << " (at #" << p.entered << ")";
    } else {
      arrived << (n_arrived++ ? ", " : "") << p.world_rank;
    }
  }
  std::ostringstream os;
  bool any = false;
  if (n_never) {
    os << "never arrived: " << never.str();
    any = true;
  }
  if (n_silent) {
    os << (any ? "; " : "") << "did not answer (" << kSilentWhy
       << "): " << (n_silent == 1 ? "rank " : "ranks ") << silent.str();
    any = true;
  }
  if (n_ahead) {
    os << (any ? "; " : "") << "ahead of this op (ranks issued different "
       << "numbers of operations): " << ahead.str();
    any = true;
  }
  if (n_arrived)
    os << (any ? "; " : "") << "also arrived: " << (n_arrived == 1 ? "rank " : "ranks ")
       << arrived.str();
  if (!any && n_arrived)
    os << " (every rank entered this op: the transport did not complete it)";
  if (peers.empty()) os << "no peers to ask";
  return os.str();
}

std::string describe_report(const tree::Aggregate& all, uint64_t seq, int self,
                            const std::vector<int>& peers, bool stall, int max_ranks) {
  tree::Aggregate a = all;
  a.remove(self);  // the asker speaks for itself
  // Up to max_ranks peers: one answer each, in the words reports always used.
  if (a.exact() && peers.size() <= static_cast<size_t>(max_ranks)) {
    const std::vector<PeerStatus> each = expand(a, peers);
    return stall ? describe_stall(each, seq, self) : describe_stragglers(each, seq);
  }
  Ranks arrived, silent, at;
  std::vector<const Group*> missing, ahead;
  for (const Group& g : a.groups()) {
    const Class c = tree::classify(g.key, seq);
    if (stall) {
      if (c == Class::kAt || c == Class::kAhead)
        arrived.add(g);
      else
        missing.push_back(&g);
      continue;
    }
    if (c == Class::kSilent)
      silent.add(g);
    else if (c == Class::kAt)
      at.add(g);
    else if (c == Class::kAhead)
      ahead.push_back(&g);
    else
      missing.push_back(&g);
  }
  std::ostringstream os;
  if (stall) {
    Group me;
    me.count = 1;
    me.ranges = {{self, self}};
    arrived.add(me);
    os << "arrived: " << arrived.str(max_ranks) << "; missing: ";
    if (missing.empty())
      os << "none (every rank entered this op: the transport has not completed it yet)";
    else
      os << list_groups(missing, max_ranks, false);
    return os.str();
  }
  bool any = false;
  if (!missing.empty()) {
    os << "never arrived: " << list_groups(missing, max_ranks, false);
    any = true;
  }
  if (silent.count) {
    os << (any ? "; " : "") << "did not answer (" << kSilentWhy << "): " << silent.str(max_ranks);
    any = true;
  }
  if (!ahead.empty()) {
    os << (any ? "; " : "") << "ahead of this op (ranks issued different numbers of operations): "
       << list_groups(ahead, max_ranks, true);
    any = true;
  }
  if (at.count) os << (any ? "; " : "") << "also arrived: " << at.str(max_ranks);
  if (!any && at.count) os << " (every rank entered this op: the transport did not complete it)";
  if (peers.empty()) os << "no peers to ask";
  return os.str();
}

}  // namespace mpi
}  // namespace tutti
