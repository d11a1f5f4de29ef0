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
#include "tutti/config.h"
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

// Whether the gpu tests run, and over which transport, decided alike on
// every rank from one all-reduce: 0 (run; test::gpu_transport() says
// "nccl" or "staged"), else a skip code, printed by rank 0.  Ranks share a
// device where a node has fewer devices than ranks (each test takes
// local_rank() % cuda_device_count()): NCCL refuses that, so they run over
// the staged transport (TUTTI_DEVICE_TRANSPORT auto or staged), unless the
// executable needs NCCL (TUTTI_TEST_NEEDS_NCCL) or the setting says nccl.
int gpu_skip_reason(int rank) {
  const int devices = tutti::cuda_device_count();
  const int local = tutti::local_size();
  const std::string setting = tutti::config::get_string("TUTTI_DEVICE_TRANSPORT");
  // MAX over ranks of: {no device, devices lacking on this node, -devices,
  // setting nccl, setting staged or no NCCL built}.
  int32_t v[5] = {devices == 0 ? 1 : 0, std::max(0, local - devices), -devices,
                  setting == "nccl" ? 1 : 0,
                  (setting == "staged" || !TUTTI_WITH_NCCL) ? 1 : 0};
  tutti::world()->allreduce(tutti::Tensor::of(v, 5), tutti::ReduceOp::kMax);
  const bool shared = v[1] > 0;
  const bool staged = v[4] || (shared && !v[3]);
  std::string why;
  if (v[0]) {
    why = "no CUDA device on some rank (fewest visible: " + std::to_string(-v[2]) +
          "): skipping GPU tests";
  } else if (shared && !staged) {
    why = "fewer CUDA devices than ranks on a node (" + std::to_string(v[1]) +
          " device(s) short) and TUTTI_DEVICE_TRANSPORT=nccl: NCCL needs one GPU per rank; "
          "skipping GPU tests";
  } else if (staged && tutti::test::needs_nccl()) {
    why = shared ? "fewer CUDA devices than ranks on a node (" + std::to_string(v[1]) +
                       " device(s) short): ranks share a GPU, which NCCL refuses, and these "
                       "tests need NCCL; skipping"
                 : std::string("these tests need NCCL, but the staged transport serves CUDA "
                               "tensors (TUTTI_DEVICE_TRANSPORT=staged, or no NCCL built); "
                               "skipping");
  }
  if (rank == 0 && !why.empty()) std::printf("%s\n", why.c_str());
  if (rank == 0 && why.empty())
    std::printf("GPU tests over %s (%d rank(s), fewest devices on a rank: %d)\n",
                staged ? "the staged transport (ranks share a GPU, or as set)" : "NCCL",
                tutti::size(), -v[2]);
  std::fflush(stdout);
  if (!why.empty()) return 1;
  tutti::test::set_gpu_transport(staged ? "staged" : "nccl");
  return kRunGpuTests;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tutti::init();
  const int rank = tutti::rank();
  // Tests labelled gpu run with TUTTI_TEST_GPU=1.  They need a CUDA device
  // on every rank; ranks that share one run over the staged transport
  // (gpu_skip_reason); otherwise the whole executable is skipped (ctest
  // SKIP_RETURN_CODE 77).  Every rank takes the same decision from one
  // all-reduce, so no rank runs a collective that a skipping peer never
  // joins.
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
