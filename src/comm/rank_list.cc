#include "comm/rank_list.h"

#include <algorithm>

#include "core/check.h"
#include "tutti/config.h"

namespace tutti {
namespace comm {

RankRanges to_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  RankRanges out;
  for (int r : ranks) {
    if (!out.empty() && r <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r);
    else
      out.emplace_back(r, r);
  }
  return out;
}

std::string format_ranks(const RankRanges& ranges, uint64_t count, int max_listed) {
  max_listed = std::max(max_listed, 1);
  uint64_t listed = 0;
  for (const auto& r : ranges) listed += static_cast<uint64_t>(r.second - r.first + 1);
  std::string s = count == 1 ? "rank " : "ranks ";
  if (count <= static_cast<uint64_t>(max_listed) && listed == count) {
    bool first = true;
    for (const auto& r : ranges)
      for (int k = r.first; k <= r.second; ++k) {
        s += (first ? "" : ", ") + std::to_string(k);
        first = false;
      }
    return s;
  }
  uint64_t shown = 0;
  size_t i = 0;
  for (; i < ranges.size() && i < static_cast<size_t>(max_listed); ++i) {
    const auto& r = ranges[i];
    s += (i ? ", " : "") + std::to_string(r.first);
    if (r.second != r.first) s += "-" + std::to_string(r.second);
    shown += static_cast<uint64_t>(r.second - r.first + 1);
  }
  if (shown < count) s += detail::cat(" and ", count - shown, " more (", count, " in all)");
  return s;
}

std::string format_ranks(const std::vector<int>& ranks, int max_listed) {
  // Duplicates are listed once.
  const RankRanges r = to_ranges(ranks);
  uint64_t n = 0;
  for (const auto& x : r) n += static_cast<uint64_t>(x.second - x.first + 1);
  return format_ranks(r, n, max_listed);
}

std::string join_ranks(const std::vector<int>& ranks, const char* sep) {
  std::string s;
  for (int r : ranks) s += detail::cat(s.empty() ? "" : sep, r);
  return s;
}

int report_max_ranks() {
  return static_cast<int>(std::max<int64_t>(1, config::get_int("TUTTI_REPORT_MAX_RANKS")));
}

}  // namespace comm
}  // namespace tutti
