// Helpers for tutti's tests: per-rank deterministic data, comparisons that
// name the first differing element, and GPU skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/tutti.h"

namespace tutti {
namespace test {

// Distinct, exactly representable value for (rank, index) in every dtype:
// small integers, so sums over a few ranks stay exact even in float16.
double rank_value(int rank, int64_t i);

// A typed buffer of n elements filled with fill(i).
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType d, int64_t n) : dtype(d), bytes(static_cast<size_t>(n) * dtype_size(d)) {}
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  Tensor tensor() { return Tensor(bytes.data(), dtype, Shape{numel()}); }
  double get(int64_t i) const { return load_as_double(bytes.data(), dtype, static_cast<size_t>(i)); }
  void set(int64_t i, double v) { store_from_double(bytes.data(), dtype, static_cast<size_t>(i), v); }
  // Sets every element to f(i) (computed in double, converted in one pass).
  template <typename F>
  void fill(F f) {
    std::vector<double> v(static_cast<size_t>(numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = f(static_cast<int64_t>(i));
    convert(v.data(), DType::kFloat64, bytes.data(), dtype, v.size());
  }
  // All elements as doubles (one conversion pass).
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(numel()));
    convert(bytes.data(), dtype, v.data(), DType::kFloat64, v.size());
    return v;
  }
};

// EXPECT-style comparison of every element with expected(i) (exact unless
// tol > 0, then |a - e| <= tol * max(1, |e|)); reports the first mismatch.
::testing::AssertionResult matches(const Buffer& b,
                                   const std::function<double(int64_t)>& expected,
                                   double tol = 0);

// Runs `op`, expecting Error(code) (an EXPECT failure otherwise); returns
// its what().
std::string expect_error(const std::function<void()>& op, ErrorCode code);
// EXPECT that `part` occurs in `s`, printing both.
void expect_contains(const std::string& s, const std::string& part);

// Exit code that ctest treats as "skipped" for tests labelled gpu.
constexpr int kSkipExitCode = 77;

// Every rank agrees whether the test passed so far (for early exits).
bool all_ranks_ok(bool ok);

// ---- GPU tests and their transport ----------------------------------------
// mpi_test_main.cc decides, collectively, whether a gpu-labelled executable
// runs.  Ranks that share a CUDA device (device = local_rank() %
// cuda_device_count(), fewer devices than ranks on a node) run it over the
// staged device transport (TUTTI_DEVICE_TRANSPORT auto or staged; NCCL
// refuses two ranks on one GPU), unless the executable needs NCCL.

// Marks the whole executable as testing NCCL itself (its communicator, its
// errors): it runs only where NCCL serves the world's CUDA tensors (every
// rank has a device of its own, NCCL is built, TUTTI_DEVICE_TRANSPORT is
// not staged), else it exits 77 (ctest SKIP) with the reason.  Use at
// namespace scope: TUTTI_TEST_NEEDS_NCCL();
bool declare_needs_nccl();
bool needs_nccl();

// What serves the world's CUDA tensors in this gpu test run, as decided by
// mpi_test_main.cc ("nccl" or "staged"; "" outside gpu runs).  The same on
// every rank.
const std::string& gpu_transport();
void set_gpu_transport(const std::string& transport);  // mpi_test_main.cc

}  // namespace test
}  // namespace tutti

// In a gpu test: skip (all ranks) when no CUDA device is available.
#define TUTTI_REQUIRE_GPU()                                             \
  do {                                                                  \
    if (::tutti::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// In a gpu test: skip (all ranks alike) unless NCCL serves the world's CUDA
// tensors (a test of NCCL's own behaviour in a file that otherwise runs over
// the staged transport too).
#define TUTTI_REQUIRE_NCCL()                                                  \
  do {                                                                        \
    if (::tutti::test::gpu_transport() != "nccl")                             \
      GTEST_SKIP() << "needs NCCL; the " << ::tutti::test::gpu_transport()    \
                   << " transport serves CUDA tensors in this run";           \
  } while (0)

// At namespace scope in a test file: the executable needs NCCL (see
// test::declare_needs_nccl).
#define TUTTI_TEST_NEEDS_NCCL() \
  [[maybe_unused]] static const bool tutti_test_needs_nccl_ = ::tutti::test::declare_needs_nccl()
