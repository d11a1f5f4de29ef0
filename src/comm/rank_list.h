// Rank lists in reports and errors, short at any world size.
//
// A handful of ranks is listed one by one, as every report always did
// ("rank 3", "ranks 1, 3, 5"); a longer list becomes ranges of consecutive
// ranks ("ranks 0-511, 513-1023"), and past `max_listed` ranges the rest is
// counted ("ranks 0-2, 4-6, 8-10 and 2045 more (2054 in all)").  The cap is
// TUTTI_REPORT_MAX_RANKS (report_max_ranks()), so a report about a thousand
// ranks stays one readable line.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tutti {
namespace comm {

// Inclusive [first, last] runs of consecutive ranks, ascending.
using RankRanges = std::vector<std::pair<int, int>>;

// `ranks` (any order, duplicates allowed) as ascending runs.
RankRanges to_ranges(std::vector<int> ranks);

// "rank 3" / "ranks 1, 3, 5" when `count` <= max_listed, else ranges as
// above.  `ranges` may hold fewer ranks than `count` (a list truncated on the
// way, e.g. by the status tree): the missing ones are counted as "more".
std::string format_ranks(const RankRanges& ranges, uint64_t count, int max_listed);
std::string format_ranks(const std::vector<int>& ranks, int max_listed);

// Every rank of `ranks`, in the given order, joined by `sep` ("2, 4" with
// ", "): log lines about a handful of lost ranks, whose text tests read.
std::string join_ranks(const std::vector<int>& ranks, const char* sep);

// TUTTI_REPORT_MAX_RANKS (>= 1).
int report_max_ranks();

}  // namespace comm
}  // namespace tutti
