// Failure reports of the checkpoint protocol, gathered once and capped.
//
// When an agreement says that some ranks failed (a shard that could not be
// written, a checkpoint that does not verify), every rank must raise an
// error naming the failing ranks and their reasons.  Each failing rank's
// text (at most kMaxText bytes) goes up the binomial tree to rank 0
// (Agreement::tree_gather); each aggregate keeps, per kind of problem, the
// kMaxReports lowest ranks' texts and counts the others, so no message
// grows with W.  Rank 0 composes one summary per kind and broadcasts it:
// every rank raises the same text, e.g.
//   "rank 3: '<file>': ...; rank 17: ...; and 1014 more ranks".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/agreement.h"

namespace tutti {
namespace ckpt {

constexpr size_t kMaxReports = 8;  // texts kept per kind
constexpr size_t kMaxText = 512;   // bytes kept per text

struct ProblemSummary {
  std::vector<int> ranks;  // the lowest failing ranks (at most kMaxReports)
  uint64_t count = 0;      // every failing rank of this kind
  std::string text;        // their texts joined, "; and N more ranks" when capped
  // "rank 3", "ranks 3, 17", "ranks 3, 17, ... (1016 ranks)"
  std::string rank_list() const;
};

// Collective over `agree`'s group.  `kind` 0: this rank has nothing to
// report.  Returns the same summaries on every rank, keyed by kind.
// `fallback(rank)` is a rank's text when it gave none; `cap`: texts kept
// per kind.
std::map<int64_t, ProblemSummary> gather_problems(Agreement& agree, int64_t kind,
                                                  const std::string& text, const char* phase,
                                                  std::string (*fallback)(int rank) = nullptr,
                                                  size_t cap = kMaxReports);

}  // namespace ckpt
}  // namespace tutti
