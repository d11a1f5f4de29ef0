// No allocation on the hot path once warm.  This executable replaces the
// global operator new to count every C++ allocation in the process (all
// threads: the training thread, the reducer's worker, the progress engine).
//  * accumulation passes (no_sync, backward_passes_per_step) and
//    grad_ready() calls that do not complete a bucket allocate nothing;
//  * reducing steps allocate no buffer: no allocation of 1 KiB or more
//    after the first step (fusion buffers are 4 KiB+ here), and the number
//    of small allocations per step (the communicator's per-operation
//    Work handles, queued closures and descriptions, ~8 per collective)
//    does not grow from step to step (+-2 per communicator that carries the
//    step's collectives: each progress engine's std::deque allocates a new
//    block every 16 queued operations and frees the old, so a step may land
//    one block more than another on every engine; the hierarchical path
//    runs on two communicators, the node-local and the cross-node one);
//  * stats().buffer_allocations stays at its value after build().
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "data_parallel/dp_test_util.h"

namespace {
std::atomic<long> g_allocs{0};
std::atomic<long> g_big_allocs{0};
constexpr size_t kBig = 1024;
}  // namespace

void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
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
  for (int step = 0; step < 6; ++step) {
    // Accumulation passes: nothing at all.
    Counts c = now();
    {
      auto guard = r.no_sync();
      pass(0);
      r.synchronize();
    }
    pass(0);
    r.synchronize();  // pass 1 of 2
    Counts acc = since(c);
    EXPECT_EQ(acc.all, 0) << "accumulation passes allocated (step " << step << ")";
    // The reducing pass: the first gradient completes no bucket.
    c = now();
    r.grad_ready(n - 1);
    EXPECT_EQ(since(c).all, 0) << "grad_ready without a launch allocated";
    c = now();
    for (int i = n - 2; i >= 0; --i) r.grad_ready(i);
    EXPECT_TRUE(r.synchronize());
    const Counts red = since(c);
    if (step > 0) EXPECT_EQ(red.big, 0) << "a buffer was allocated in step " << step;
    per_step.push_back(red.all);
  }
  // Small per-operation allocations in the communicator: constant per step
  // up to the deques' block recycling (2 per engine carrying the step).
  const long slack = GetParam() ? 4 : 2;
  for (size_t s = 2; s < per_step.size(); ++s)
    EXPECT_LE(per_step[s], per_step[1] + slack) << "step " << s;
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
