// main() for every C++ test: initialise tutti (MPI under mpiexec), run the
// tests on every rank, and keep the output readable: rank 0 prints the
// normal report, other ranks print only failures, prefixed with their rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tutti::init();
  const int rank = tutti::rank();
  // Tests labelled gpu run with TUTTI_TEST_GPU=1: without a device the whole
  // executable is skipped (ctest SKIP_RETURN_CODE) on every rank.
  const char* gpu = std::getenv("TUTTI_TEST_GPU");
  if (gpu && std::string(gpu) == "1" && tutti::cuda_device_count() == 0) {
    if (rank == 0) std::printf("no CUDA device: skipping GPU tests\n");
    tutti::shutdown();
    return 77;
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
