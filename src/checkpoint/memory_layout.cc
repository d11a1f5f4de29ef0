#include "checkpoint/memory_layout.h"

#include <map>

#include "comm/rank_list.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {

int NodeLayout::local_index(int rank) const {
  const auto& m = members[static_cast<size_t>(node_of[static_cast<size_t>(rank)])];
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] == rank) return static_cast<int>(i);
  TUTTI_THROW(kInternal, "memory tier: rank ", rank, " is not in its host's member list");
}

NodeLayout layout_from_keys(const std::vector<int64_t>& keys) {
  NodeLayout l;
  std::map<int64_t, int> index;  // key -> host, in order of first rank
  l.node_of.resize(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    auto it = index.find(keys[r]);
    if (it == index.end()) {
      it = index.emplace(keys[r], static_cast<int>(l.members.size())).first;
      l.members.emplace_back();
    }
    l.node_of[r] = it->second;
    l.members[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
  }
  return l;
}

int buddy_of(const NodeLayout& layout, int rank) {
  if (layout.nodes() < 2) return -1;
  const int next = (layout.node_of[static_cast<size_t>(rank)] + 1) % layout.nodes();
  const auto& m = layout.members[static_cast<size_t>(next)];
  return m[static_cast<size_t>(layout.local_index(rank)) % m.size()];
}

std::vector<int> buddy_senders(const NodeLayout& layout, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(layout.node_of.size()); ++r)
    if (buddy_of(layout, r) == rank) out.push_back(r);
  return out;
}

std::vector<FileTransfer> plan_transfers(const NodeLayout& layout,
                                         const std::vector<int>& holder,
                                         const std::vector<int64_t>& lacking) {
  const int words = bitmap_words(layout.nodes());
  TUTTI_CHECK(lacking.size() == holder.size() * static_cast<size_t>(words), "memory tier: ",
              lacking.size(), " bitmap words for ", holder.size(), " files and ",
              layout.nodes(), " hosts");
  std::vector<FileTransfer> out;
  for (size_t f = 0; f < holder.size(); ++f) {
    if (holder[f] < 0) continue;
    for (int n = 0; n < layout.nodes(); ++n) {
      const uint64_t w = static_cast<uint64_t>(lacking[f * words + static_cast<size_t>(n / 64)]);
      if (!((w >> (n % 64)) & 1u)) continue;
      if (layout.node_of[static_cast<size_t>(holder[f])] == n) continue;  // holds it itself
      out.push_back({static_cast<int>(f), holder[f], layout.leader(n)});
    }
  }
  return out;
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (const auto& r : comm::to_ranges(ranks)) {
    out += (out.empty() ? "" : ", ") + std::to_string(r.first);
    if (r.second != r.first) out += "-" + std::to_string(r.second);
  }
  return out;
}

}  // namespace ckpt
}  // namespace tutti
