// The launch planner of the multi-tensor kernels: every (tensor, chunk) is
// covered exactly once, limits hold, partial slots are dense.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "amp/multi_tensor_plan.h"
#include "tutti/error.h"

namespace tutti {
namespace amp {
namespace {

void check_plan(const std::vector<int64_t>& numels) {
  std::vector<MtaEntry> entries(numels.size());
  std::vector<char> fake(1);
  for (size_t i = 0; i < numels.size(); ++i) {
    entries[i].numel = numels[i];
    entries[i].src = fake.data() + 0;  // only identity matters here
    entries[i].prescale = static_cast<float>(i);
  }
  MtaPlanner planner(entries);
  int64_t expected_chunks = 0;
  for (int64_t n : numels) expected_chunks += mta_chunks(n);
  ASSERT_EQ(planner.total_chunks(), expected_chunks);

  std::map<std::pair<int, int64_t>, int> seen;  // (tensor, chunk) -> count
  std::vector<int> base_of(numels.size(), -1);
  std::vector<int> global_seen(static_cast<size_t>(expected_chunks), 0);
  MtaTable t;
  int launches = 0;
  while (planner.next(&t)) {
    ++launches;
    ASSERT_GT(t.n_blocks, 0);
    ASSERT_LE(t.n_blocks, MtaTable::kMaxBlocks);
    ASSERT_GT(t.n_tensors, 0);
    ASSERT_LE(t.n_tensors, MtaTable::kMaxTensors);
    std::vector<int> blocks_per_slot(t.n_tensors, 0);
    for (int s = 0; s < t.n_tensors; ++s) {
      const int idx = t.index[s];
      ASSERT_GE(idx, 0);
      ASSERT_LT(idx, static_cast<int>(numels.size()));
      EXPECT_EQ(t.numel[s], numels[idx]);
      EXPECT_EQ(t.prescale[s], static_cast<float>(idx));
      if (base_of[idx] < 0) base_of[idx] = t.chunk_base[s];
      EXPECT_EQ(base_of[idx], t.chunk_base[s]) << "tensor " << idx;
    }
    for (int b = 0; b < t.n_blocks; ++b) {
      const int s = t.block_slot[b];
      ASSERT_LT(s, t.n_tensors);
      ++blocks_per_slot[s];
      const int idx = t.index[s];
      const int64_t c = t.block_chunk[b];
      ASSERT_GE(c, 0);
      ASSERT_LT(c, mta_chunks(numels[idx]));
      ++seen[{idx, c}];
      ++global_seen[static_cast<size_t>(t.chunk_base[s] + c)];
    }
    for (int s = 0; s < t.n_tensors; ++s) EXPECT_GT(blocks_per_slot[s], 0) << "slot " << s;
  }
  EXPECT_FALSE(planner.next(&t)) << "the planner restarted";
  for (size_t i = 0; i < numels.size(); ++i)
    for (int64_t c = 0; c < mta_chunks(numels[i]); ++c)
      EXPECT_EQ((seen[{static_cast<int>(i), c}]), 1) << "tensor " << i << " chunk " << c;
  for (size_t g = 0; g < global_seen.size(); ++g) EXPECT_EQ(global_seen[g], 1) << g;
  // Dense partials in list order: tensor i starts after tensors < i.
  int64_t base = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] > 0) EXPECT_EQ(base_of[i], base) << "tensor " << i;
    base += mta_chunks(numels[i]);
  }
  if (expected_chunks == 0) EXPECT_EQ(launches, 0);
}

TEST(MultiTensorPlan, EmptyListsAndEmptyTensors) {
  check_plan({});
  check_plan({0});
  check_plan({0, 0, 0});
}

TEST(MultiTensorPlan, ChunkBoundaries) {
  const int64_t c = MtaTable::kChunk;
  check_plan({1});
  check_plan({c - 1, c, c + 1});
  check_plan({0, 2 * c, 0, 1, 3 * c + 7});
}

TEST(MultiTensorPlan, TensorSlotLimit) {
  // More tiny tensors than slots: several launches, one block each.
  for (int n : {MtaTable::kMaxTensors - 1, MtaTable::kMaxTensors,
                MtaTable::kMaxTensors + 1, 5 * MtaTable::kMaxTensors + 3}) {
    check_plan(std::vector<int64_t>(static_cast<size_t>(n), 3));
  }
}

TEST(MultiTensorPlan, BlockLimitSplitsOneTensorAcrossLaunches) {
  const int64_t c = MtaTable::kChunk;
  check_plan({c * MtaTable::kMaxBlocks});
  check_plan({c * MtaTable::kMaxBlocks + 1});
  check_plan({5, c * (2 * MtaTable::kMaxBlocks + 3) + 11, 5});
}

TEST(MultiTensorPlan, RandomLists) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> count(0, 200);
  std::uniform_int_distribution<int> kind(0, 5);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int64_t> numels(static_cast<size_t>(count(rng)));
    for (auto& n : numels) {
      switch (kind(rng)) {
        case 0: n = 0; break;
        case 1: n = 1; break;
        case 2: n = rng() % 1000; break;
        case 3: n = MtaTable::kChunk * (1 + rng() % 4) + (rng() % 3) - 1; break;
        default: n = rng() % (MtaTable::kChunk * 40); break;
      }
    }
    check_plan(numels);
  }
}

TEST(MultiTensorPlan, LauncherTableCheck) {
  std::vector<MtaEntry> entries(2);
  entries[0].numel = 10;
  entries[1].numel = 3 * MtaTable::kChunk;
  entries[1].dst_dtype = kMtaBF16;
  MtaPlanner planner(entries);
  MtaTable t;
  ASSERT_TRUE(planner.next(&t));
  check_table(t, "test", true);  // a planned table passes
  MtaTable bad = t;
  bad.block_slot[1] = 7;
  EXPECT_THROW(check_table(bad, "test", true), Error);
  bad = t;
  bad.dst_dtype[1] = 9;
  EXPECT_THROW(check_table(bad, "test", true), Error);
  check_table(bad, "test", false);  // the norm kernel has no destination
  bad = t;
  bad.n_blocks = 0;
  EXPECT_THROW(check_table(bad, "test", false), Error);
  bad = t;
  bad.n_tensors = MtaTable::kMaxTensors + 1;
  EXPECT_THROW(check_table(bad, "test", false), Error);
}

TEST(MultiTensorPlan, TableFitsTheKernelArgumentLimit) {
  EXPECT_LE(sizeof(MtaTable), 4096u);
}

}  // namespace
}  // namespace amp
}  // namespace tutti
