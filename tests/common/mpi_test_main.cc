// main() for every C++ test: initialise tutti (MPI under mpiexec), run the
// tests on every rank, and keep the output readable: rank 0 prints the
// normal report, other ranks print only failures, prefixed with their rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/test_util.h"
#include "tutti/tutti.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

constexpr int kRunGpuTests = 0;

// 0 when every rank has a CUDA device of its own on its node, else a code
// (the largest over ranks): 1 some node has fewer devices than ranks, 2 some
// rank sees no device.  Collective; rank 0 prints the reason.
int gpu_skip_reason(int rank) {
  const int devices = tutti::cuda_device_count();
  const int local = tutti::local_size();
  // {code, devices lacking on this node, -devices}: one MAX gives the worst
  // code, the largest shortfall and the smallest device count.
  int32_t v[3] = {devices == 0 ? 2 : (devices < local ? 1 : 0),
                  std::max(0, local - devices), -devices};
  tutti::world()->allreduce(tutti::Tensor::of(v, 3), tutti::ReduceOp::kMax);
  if (rank == 0 && v[0] == 2)
    std::printf("no CUDA device on some rank (fewest visible: %d): skipping "
                "GPU tests\n", -v[2]);
  else if (rank == 0 && v[0] == 1)
    std::printf("fewer CUDA devices than ranks on a node (%d device(s) "
                "short; tests need one GPU per rank, %d ranks in all): "
                "skipping GPU tests\n", v[1], tutti::size());
  std::fflush(stdout);
  return v[0];
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tutti::init();
  const int rank = tutti::rank();
  // Tests labelled gpu run with TUTTI_TEST_GPU=1.  They need one CUDA device
  // per rank on each node (NCCL refuses two ranks on one GPU): without that
  // the whole executable is skipped (ctest SKIP_RETURN_CODE 77).  Every rank
  // takes the same decision from one all-reduce, so no rank runs a
  // collective that a skipping peer never joins.
  const char* gpu = std::getenv("TUTTI_TEST_GPU");
  if (gpu && std::string(gpu) == "1") {
    const int skip = gpu_skip_reason(rank);
    if (skip != kRunGpuTests) {
      tutti::shutdown();
      return tutti::test::kSkipExitCode;
    }
  }
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  tutti::shutdown();
  return rc;
}
