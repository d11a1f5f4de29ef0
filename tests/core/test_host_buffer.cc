#include <gtest/gtest.h>

#include <cstdint>

#include "core/host_buffer.h"

namespace tutti {
namespace {

TEST(HostBuffer, AlignedAndReusable) {
  HostBuffer b(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_GE(b.bytes(), 1000u);
  void* p = b.data();
  b.reserve(10);
  EXPECT_EQ(b.data(), p) << "reserve never shrinks";
  HostBuffer c(std::move(b));
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);
}

TEST(HostBufferPool, NoAllocationOnceWarm) {
  HostBufferPool pool;
  for (int step = 0; step < 5; ++step) {
    HostBuffer a = pool.acquire(4096), c = pool.acquire(100);
    pool.release(std::move(a));
    pool.release(std::move(c));
  }
  EXPECT_EQ(pool.allocations(), 2u);
  EXPECT_EQ(pool.free_count(), 2u);
  HostBuffer small = pool.acquire(50);
  EXPECT_LT(small.bytes(), 4096u) << "best fit";
}

}  // namespace
}  // namespace tutti
