// Ranks that disagree about a collective get an error on every rank naming
// the op's sequence number and the differing rank; nobody hangs, and the
// communicator stays usable because no rank ran the op.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"

namespace tutti {
namespace {

using test::expect_contains;
using test::expect_error;

// After each failure the world must still work.
void expect_world_usable() {
  auto w = world();
  int32_t one = 1;
  w->allreduce(Tensor::of(&one, 1));
  EXPECT_EQ(one, w->size());
}

class Mismatch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (w->size() < 2) GTEST_SKIP() << "needs two or more ranks";
  }
  ProcessGroupPtr w = world();
  int rank = w->rank();
};

TEST_F(Mismatch, DifferentDTypeNamesTheRank) {
  std::vector<float> f(100, 1.0f);
  std::vector<uint16_t> h(100, float_to_half(1.0f));
  Tensor t = rank == 1 ? Tensor(h.data(), DType::kFloat16, Shape{100}) : Tensor::of(f);
  const std::string m = expect_error([&] { w->allreduce(t, ReduceOp::kSum, {"layer3.weight"}); },
                                     ErrorCode::kMismatch);
  expect_contains(m, "rank " + std::to_string(rank) + ":");
  expect_contains(m, "allreduce #");
  expect_contains(m, "'layer3.weight'");
  expect_contains(m, "rank 1 has allreduce #");
  expect_contains(m, "float16 x100");
  expect_contains(m, "but rank 0 has allreduce #");
  expect_contains(m, "float32 x100");
  EXPECT_EQ(f[0], 1.0f) << "no rank ran the op";
  expect_world_usable();
}

TEST_F(Mismatch, DifferentCountAndOp) {
  std::vector<float> v(rank == w->size() - 1 ? 7 : 8, 1.0f);
  std::string m = expect_error([&] { w->allreduce(Tensor::of(v)); }, ErrorCode::kMismatch);
  expect_contains(m, "rank " + std::to_string(w->size() - 1) + " has");
  expect_contains(m, "x7 sum");
  expect_contains(m, "x8 sum");
  std::vector<float> u(8, 1.0f);
  m = expect_error([&] { w->allreduce(Tensor::of(u), rank == 0 ? ReduceOp::kMax : ReduceOp::kSum); },
                   ErrorCode::kMismatch);
  expect_contains(m, "max");
  expect_world_usable();
}

TEST_F(Mismatch, DifferentRootAndDifferentKind) {
  std::vector<int32_t> v(4, rank);
  std::string m = expect_error([&] { w->broadcast(Tensor::of(v), rank == 1 ? 1 : 0); },
                               ErrorCode::kMismatch);
  expect_contains(m, "root 1");
  expect_contains(m, "root 0");
  // rank 0 broadcasts while the others all-reduce.
  m = expect_error([&] {
    if (rank == 0)
      w->broadcast(Tensor::of(v), 0);
    else
      w->allreduce(Tensor::of(v));
  }, ErrorCode::kMismatch);
  expect_contains(m, "broadcast #");
  expect_contains(m, "allreduce #");
  expect_world_usable();
}

TEST_F(Mismatch, InvalidArgumentsOnOneRankFailEveryRank) {
  std::vector<float> in(10, 1.0f), out(rank == 1 ? 9 : 10);
  const std::string m = expect_error(
      [&] { w->allreduce(Tensor::of(in), Tensor::of(out), ReduceOp::kSum); },
      rank == 1 ? ErrorCode::kInvalidArgument : ErrorCode::kMismatch);
  if (rank == 1) {
    expect_contains(m, "output float32[9] cpu has 9 elements, expected 10");
  } else {
    expect_contains(m, "rank 1 rejected the arguments");
  }
  expect_world_usable();
}

TEST_F(Mismatch, SkippedBarrierIsCaught) {
  // Rank 1 skips one barrier: its next op carries the sequence number its
  // peers used for the barrier, with another kind.
  std::vector<float> v(3, 1.0f);
  const std::string m = expect_error([&] {
    if (rank != 1) w->barrier();
    w->allreduce(Tensor::of(v));
  }, ErrorCode::kMismatch);
  expect_contains(m, "barrier #");
  expect_contains(m, "allreduce #");
  // Ranks other than 1 fail in the barrier and never reach the allreduce;
  // rank 1 failed in the allreduce.  Realign: rank 1 does nothing more.
  expect_world_usable();
}

TEST_F(Mismatch, AsyncErrorsSurfaceFromWait) {
  std::vector<float> v(rank == 0 ? 5 : 6, 1.0f);
  WorkPtr work = w->allreduce_async(Tensor::of(v));
  const std::string m = expect_error([&] { work->wait(); }, ErrorCode::kMismatch);
  expect_contains(m, "allreduce #");
  EXPECT_THROW(work->test(), Error);
  expect_world_usable();
}

TEST(LocalErrors, CudaTensorWithoutCuda) {
  if (cuda_built() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  float dummy[4];
  Tensor t(dummy, DType::kFloat32, Shape{4}, Device::cuda(0));
  try {
    world()->allreduce(t);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    // Without CUDA support: kUnsupported; with it but no device: the
    // argument is wrong for this machine.
    EXPECT_EQ(e.code(), cuda_built() ? ErrorCode::kInvalidArgument : ErrorCode::kUnsupported) << m;
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
    if (cuda_built()) EXPECT_NE(m.find("sees 0 CUDA device(s)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tutti
