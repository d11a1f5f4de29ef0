// The memory tier across hosts, pure parts (src/checkpoint/memory_layout.h):
// hosts from node keys, buddies, and the restore's transfer plan.
#include <gtest/gtest.h>

#include <vector>

#include "checkpoint/memory_layout.h"
#include "tutti/error.h"

using namespace tutti::ckpt;

namespace {
// Bitmap of lacking hosts for `files` files over `nodes` hosts.
std::vector<int64_t> lacking(int files, int nodes,
                             const std::vector<std::pair<int, int>>& file_node) {
  const int w = bitmap_words(nodes);
  std::vector<int64_t> out(static_cast<size_t>(files * w), 0);
  for (auto fn : file_node)
    out[static_cast<size_t>(fn.first * w + fn.second / 64)] |=
        static_cast<int64_t>(uint64_t{1} << (fn.second % 64));
  return out;
}
}  // namespace

TEST(MemoryLayout, HostsInOrderOfTheirLowestRank) {
  // Ranks 0,3 on host key 7; 1,4 on key 2; 2,5 on key 9.
  NodeLayout l = layout_from_keys({7, 2, 9, 7, 2, 9});
  ASSERT_EQ(l.nodes(), 3);
  EXPECT_EQ(l.node_of, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(l.members[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(l.leader(2), 2);
  EXPECT_EQ(l.local_index(4), 1);
}

TEST(MemoryLayout, BuddyIsTheSameLocalIndexOnTheNextHost) {
  NodeLayout l = layout_from_keys({1, 1, 2, 2, 3, 3});  // 3 hosts x 2
  EXPECT_EQ(buddy_of(l, 0), 2);
  EXPECT_EQ(buddy_of(l, 1), 3);
  EXPECT_EQ(buddy_of(l, 3), 5);
  EXPECT_EQ(buddy_of(l, 4), 0);  // wraps
  EXPECT_EQ(buddy_of(l, 5), 1);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(buddy_senders(l, buddy_of(l, r)), std::vector<int>{r});
  EXPECT_EQ(buddy_of(layout_from_keys({1, 1, 1}), 2), -1);  // one host: none
}

TEST(MemoryLayout, UnevenHostsShareBuddies) {
  NodeLayout l = layout_from_keys({1, 1, 1, 2});  // 3 ranks, then 1
  EXPECT_EQ(buddy_of(l, 0), 3);
  EXPECT_EQ(buddy_of(l, 1), 3);
  EXPECT_EQ(buddy_of(l, 2), 3);
  EXPECT_EQ(buddy_of(l, 3), 0);
  EXPECT_EQ(buddy_senders(l, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(buddy_senders(l, 1).empty());
}

TEST(MemoryLayout, TransfersGoFromTheLowestHolderToEachLackingLeader) {
  NodeLayout l = layout_from_keys({1, 1, 2, 2, 3, 3});  // leaders 0, 2, 4
  // File 0 held by rank 0 (host 0), lacked by hosts 1 and 2; file 1 held
  // by rank 2, lacked by host 0; file 2 held everywhere; file 3 lost.
  const auto plan = plan_transfers(l, {0, 2, 0, -1}, lacking(4, 3, {{0, 1}, {0, 2}, {1, 0}, {3, 0}}));
  EXPECT_EQ(plan, (std::vector<FileTransfer>{{0, 0, 2}, {0, 0, 4}, {1, 2, 0}}));
}

TEST(MemoryLayout, BitmapsSpanSeveralWords) {
  std::vector<int64_t> keys;
  for (int n = 0; n < 70; ++n) keys.push_back(n);  // 70 hosts x 1 rank
  NodeLayout l = layout_from_keys(keys);
  ASSERT_EQ(bitmap_words(l.nodes()), 2);
  const auto plan = plan_transfers(l, {5}, lacking(1, 70, {{0, 3}, {0, 66}, {0, 5}}));
  // Host 5 holds it itself: no copy there.
  EXPECT_EQ(plan, (std::vector<FileTransfer>{{0, 5, 3}, {0, 5, 66}}));
  EXPECT_THROW(plan_transfers(l, {5}, std::vector<int64_t>(1, 0)), tutti::Error);
}

TEST(MemoryLayout, RankRanges) {
  EXPECT_EQ(rank_ranges({}), "");
  EXPECT_EQ(rank_ranges({4}), "4");
  EXPECT_EQ(rank_ranges({1, 4, 5, 6, 9}), "1, 4-6, 9");
}
