// No allocation on the hot path once warm.  This executable replaces the
// global operator new to count every C++ allocation in the process (all
// threads: the training thread, the reducer's worker, the progress engine).
//  * accumulation passes (no_sync, backward_passes_per_step) and
//    grad_ready() calls that do not complete a bucket allocate nothing on
//    the calling thread (counted per thread: other threads' periodic work
//    may allocate at any moment) and no buffer anywhere;
//  * reducing steps allocate no buffer: no allocation of 1 KiB or more
//    after the first step (fusion buffers are 4 KiB+ here);
//  * the small allocations of a reducing step (the communicator's
//    per-operation Work handles, queued closures and descriptions, 6-8 per
//    collective when measured) stay under 16 per collective in the
//    cheapest of kSteps steps.  Their count per step is not compared from
//    step to step: it depends on timing in both directions (other threads'
//    periodic work, each progress engine's std::deque allocating a block
//    every 16 queued operations, waits that do or do not sleep): 86-136 per
//    hierarchical step at np 4 on a loaded machine, with no trend over 120
//    steps.  A buffer allocated per step is caught by the 1 KiB check and
//    by buffer_allocations;
//  * stats().buffer_allocations stays at its value after build().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "data_parallel/dp_test_util.h"

namespace {
std::atomic<long> g_allocs{0};
std::atomic<long> g_big_allocs{0};
thread_local long t_allocs = 0;  // this thread's
constexpr size_t kBig = 1024;
}  // namespace

void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  ++t_allocs;
  if (n >= kBig) g_big_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace tutti {
namespace {

using test::ParamDecl;

struct Counts {
  long all, big;
};
Counts now() { return {g_allocs.load(), g_big_allocs.load()}; }
Counts since(Counts c) { return {g_allocs.load() - c.all, g_big_allocs.load() - c.big}; }

const std::vector<ParamDecl> kParams = {
    {"w1", DType::kFloat32, Shape{64, 32}}, {"b1", DType::kFloat32, Shape{64}},
    {"w2", DType::kFloat32, Shape{32, 64}}, {"b2", DType::kFloat32, Shape{32}},
    {"w3", DType::kFloat32, Shape{10, 32}}, {"b3", DType::kFloat32, Shape{10}}};

constexpr int kSteps = 12;  // reducing steps (each a few ms)
class Alloc : public ::testing::TestWithParam<bool> {};  // hierarchical?

TEST_P(Alloc, SteadyStateStepsDoNotAllocateBuffers) {
  auto params = test::make_params(kParams);
  ReducerOptions o;
  o.bucket_cap_mb = 8192.0 / (1 << 20);
  o.first_bucket_cap_mb = 0;
  o.backward_passes_per_step = 2;
  o.hierarchical = GetParam();
  o.hierarchical_node_size = 2;
  Reducer r(world(), o);
  test::register_all(r, params);
  r.build();
  const int64_t buffers = r.stats().buffer_allocations;
  ASSERT_GE(r.buckets().size(), 2u);
  const int n = r.num_parameters();
  auto pass = [&](int upto) {
    for (int i = n - 1; i >= upto; --i) r.grad_ready(i);
  };
  std::vector<long> per_step;
  for (int step = 0; step < kSteps; ++step) {
    // Accumulation passes: nothing at all on this thread (other threads'
    // periodic work, e.g. the watchdog's, may allocate at any time).
    long mine = t_allocs;
    Counts c = now();
    {
      auto guard = r.no_sync();
      pass(0);
      r.synchronize();
    }
    pass(0);
    r.synchronize();  // pass 1 of 2
    EXPECT_EQ(t_allocs - mine, 0) << "accumulation passes allocated (step " << step << ")";
    EXPECT_EQ(since(c).big, 0) << "accumulation passes allocated a buffer (step " << step << ")";
    // The reducing pass: the first gradient completes no bucket.
    mine = t_allocs;
    r.grad_ready(n - 1);
    EXPECT_EQ(t_allocs - mine, 0) << "grad_ready without a launch allocated";
    c = now();
    for (int i = n - 2; i >= 0; --i) r.grad_ready(i);
    EXPECT_TRUE(r.synchronize());
    const Counts red = since(c);
    if (step > 0) EXPECT_EQ(red.big, 0) << "a buffer was allocated in step " << step;
    per_step.push_back(red.all);
  }
  // Small per-operation allocations, bounded per collective (the flat path
  // runs one all-reduce per bucket, the hierarchical one three: node
  // reduce-scatter, cross all-reduce, node all-gather).  Other threads only
  // add to a step's count, so the check reads the fewest over the steps.
  const long collectives = static_cast<long>(r.buckets().size()) * (GetParam() ? 3 : 1);
  const long fewest = *std::min_element(per_step.begin() + 1, per_step.end());
  EXPECT_LE(fewest, 16 * collectives) << collectives << " collectives per step";
  EXPECT_EQ(r.stats().buffer_allocations, buffers);
  if (world()->rank() == 0)
    std::printf("small allocations per reducing step (%zu buckets): %ld\n", r.buckets().size(),
                per_step.back());
}

INSTANTIATE_TEST_SUITE_P(Modes, Alloc, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Hierarchical" : "Flat";
                         });

}  // namespace
}  // namespace tutti
