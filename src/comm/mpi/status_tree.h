// The status tree's pure parts (no MPI): the tree over a communicator's
// members, the aggregate of their answers, and the wire format.  The
// service that runs the protocol is status_service.{h,cc}; the texts built
// from an aggregate are status_report.cc.
//
// Tree.  A communicator's members, as world ranks in ascending order (every
// member computes the same list from its own peers), are indexed 0..W-1.  A
// node owns a contiguous span [lo, hi) of indices: it is member `lo`, and
// [lo+1, hi) is cut into at most `fanout` contiguous chunks of near-equal
// size, each owned by one child.  Member 0 owns [0, W) and is the root;
// depth ceil(log_fanout(W)) roughly.  Contiguous spans keep a subtree's ranks
// in a few ranges (one for the world), so aggregates stay small.
//
// Aggregate.  Ranks that answered alike (answered, member, last op entered,
// finished it, its kind) form one group with a count and rank ranges;
// merging two aggregates merges groups with equal keys.  A group keeps at
// most kMaxRanges ranges (the lowest: the count stays exact) and an
// aggregate at most kMaxGroups groups (past it, groups of the same class
// relative to the op asked about are folded, keeping the lowest and
// highest op entered), so a message is a few KiB at any W.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/rank_list.h"

namespace tutti {
namespace mpi {
namespace tree {

// Member indices [lo, hi); the node is member `lo`.
struct Span {
  int lo = 0;
  int hi = 0;
  int size() const { return hi - lo; }
  bool operator==(const Span& o) const { return lo == o.lo && hi == o.hi; }
};

// The children's spans of `s` (at most `fanout`, the first the largest).
std::vector<Span> children(Span s, int fanout);
// Levels below the node owning `s` (0 for a leaf).
int height(Span s, int fanout);
// The span owned by member `index` of a tree over `w` members, and its
// parent's span (parent.hi == 0 for the root).
struct Where {
  Span self;
  Span parent;
};
Where locate(int w, int index, int fanout);

// Members as runs of an arithmetic progression (the world: one run; a
// data-parallel group of a mesh: one strided run).  On the wire.
struct Run {
  int32_t first;
  int32_t stride;
  int32_t count;
};
static_assert(sizeof(Run) == 12, "member run: 3 x int32");
std::vector<Run> encode_members(const std::vector<int>& sorted_ranks);
std::vector<int> decode_members(const std::vector<Run>& runs);

// One member's answer about a communicator.
struct Answer {
  bool answered = false;  // replied within its deadline
  bool member = false;    // knows the communicator
  uint64_t entered = 0;   // its last op entered there
  bool finished = false;  // and completed it
  uint8_t kind = 0;       // CommProgress::kind of `entered`
};

struct Group {
  Answer key;
  uint64_t entered_hi = 0;  // > key.entered: folded groups (various ops)
  bool mixed = false;       // folded: kind / finished vary
  uint64_t count = 0;       // ranks in the group (exact)
  comm::RankRanges ranges;  // ascending; the lowest kMaxRanges
};

constexpr size_t kMaxRanges = 64;
constexpr size_t kMaxGroups = 64;

class Aggregate {
 public:
  // Adds one rank's answer (or, !answered, a rank that did not answer).
  void add(int world_rank, const Answer& a);
  // Adds every rank of `ranks` as not answering.
  void add_silent(const std::vector<int>& ranks);
  void merge(const Aggregate& other);
  // Folds groups past kMaxGroups; `seq` is the op the report is about.
  void cap(uint64_t seq);
  // Removes `world_rank` (the asker: it reports itself).
  void remove(int world_rank);
  const std::vector<Group>& groups() const { return groups_; }
  uint64_t ranks() const;
  // Every rank listed (no group truncated).
  bool exact() const;

  // Wire format: appended to / read from a message.
  void serialize(std::vector<uint8_t>& out) const;
  // Reads what serialize() wrote at `p` (at most `n` bytes); false when
  // malformed.
  bool parse(const uint8_t* p, size_t n);

 private:
  void add_group(const Group& g);
  std::vector<Group> groups_;
};

// How a group stands relative to op #seq.
enum class Class : uint8_t { kSilent, kNotMember, kNotStarted, kBehind, kAt, kAhead };
Class classify(const Answer& a, uint64_t seq);

}  // namespace tree
}  // namespace mpi
}  // namespace tutti
