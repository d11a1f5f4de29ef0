// tutti refuses to run on an MPI below MPI_THREAD_MULTIPLE (its progress,
// NCCL watchdog and bucket threads call MPI next to the application's):
// the decision, and the message that names both levels.  The end-to-end
// refusal (init() under TUTTI_MPI_THREAD_LEVEL=funneled) is
// thread_level_probe.cc.
#include <gtest/gtest.h>

#include <string>

#include "comm/mpi/mpi_runtime.h"

namespace tutti {
namespace mpi {
namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ThreadLevel, OnlyMultipleIsEnough) {
  EXPECT_EQ(thread_level_problem(MPI_THREAD_MULTIPLE, true), "");
  EXPECT_EQ(thread_level_problem(MPI_THREAD_MULTIPLE, false), "");
  for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED}) {
    for (bool owned : {true, false}) {
      const std::string m = thread_level_problem(level, owned);
      EXPECT_TRUE(has(m, "MPI granted " + thread_level_name(level) +
                             " but tutti needs MPI_THREAD_MULTIPLE")) << m;
      // The application's MPI (or mpi4py's) is told how to fix it.
      EXPECT_EQ(has(m, "mpi4py.rc.thread_level"), !owned) << m;
    }
  }
}

TEST(ThreadLevel, Names) {
  EXPECT_EQ(thread_level_name(MPI_THREAD_SINGLE), "MPI_THREAD_SINGLE");
  EXPECT_EQ(thread_level_name(MPI_THREAD_FUNNELED), "MPI_THREAD_FUNNELED");
  EXPECT_EQ(thread_level_name(MPI_THREAD_SERIALIZED), "MPI_THREAD_SERIALIZED");
  EXPECT_EQ(thread_level_name(MPI_THREAD_MULTIPLE), "MPI_THREAD_MULTIPLE");
  EXPECT_EQ(thread_level_name(42), "thread level 42");
}

TEST(ThreadLevel, RequestedLevelDefaultsToMultiple) {
  // The suite runs without TUTTI_MPI_THREAD_LEVEL (and init() succeeded).
  EXPECT_EQ(requested_thread_level(), MPI_THREAD_MULTIPLE);
}

}  // namespace
}  // namespace mpi
}  // namespace tutti
