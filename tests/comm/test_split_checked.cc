// Communicator splits go through the agreement check like every collective:
// a rank that splits while its peers run another op (or another kind of
// split) gets kMismatch on every rank instead of a hang, and the group
// stays usable because no rank ran the split.  (A rank that never arrives:
// timeout_probe.cc, mode split.)
#include <gtest/gtest.h>

#include <string>

#include "common/test_util.h"

namespace tutti {
namespace {

std::string expect_mismatch(const std::function<void()>& op) {
  try {
    op();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error was raised";
  return "";
}

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "'" << part << "' not in: " << s;
}

class SplitChecked : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world()->size() < 2) GTEST_SKIP() << "needs two or more ranks";
    // A fresh group: init() already made the world's node group (cached).
    w = world()->split_group(0, world()->rank(), "split_checked");
    rank = w->rank();
  }
  ProcessGroupPtr w;
  int rank = 0;
};

TEST_F(SplitChecked, NodeSplitAgainstBarrierIsAMismatch) {
  const std::string m = expect_mismatch([&] {
    if (rank == 0)
      w->node_group();
    else
      w->barrier();
  });
  expect_contains(m, "rank 0 has node split #");
  expect_contains(m, "barrier #");
  // Nobody ran the split: the world and a later node split still work.
  int32_t one = 1;
  w->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, w->size());
  auto node = w->node_group();  // every rank of this test runs on one host
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->size(), w->size());
  int32_t r = rank;
  node->allreduce(Tensor::of(&r, 1), ReduceOp::kMax);
  EXPECT_EQ(r, w->size() - 1);
}

TEST_F(SplitChecked, NodeSplitAgainstSplitIsAMismatch) {
  const int last = w->size() - 1;
  const std::string m = expect_mismatch([&] {
    if (rank == last)
      w->node_group();
    else
      w->split_group(0, rank, "split_checked/child");
  });
  expect_contains(m, "rank " + std::to_string(last) + " has node split #");
  expect_contains(m, "but rank 0 has split #");
  int32_t one = 1;
  w->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, w->size());
}

}  // namespace
}  // namespace tutti
