// Device discipline, the parts that need no GPU: the restore decision of
// DeviceGuard, check_launch's verdict, the thread-local "device set by
// tutti" bookkeeping, and the TUTTI_CHECK_DEVICE switch.  The CUDA halves are
// in test_device_gpu.cc.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "core/cuda_utils.h"
#include "core/host_buffer.h"
#include "tutti/config.h"

namespace tutti {
namespace {

using cuda::ContextState;

TEST(DeviceGuardRestore, OnlyAPreviousDeviceWithAnActiveContext) {
  // A fresh thread: "previous" is 0 and its context may not exist.
  EXPECT_FALSE(cuda::should_restore_device(0, 1, ContextState::kInactive));
  EXPECT_FALSE(cuda::should_restore_device(0, 1, ContextState::kUnknown))
      << "when the driver cannot say, never risk a context";
  EXPECT_TRUE(cuda::should_restore_device(0, 1, ContextState::kActive));
  EXPECT_TRUE(cuda::should_restore_device(3, 2, ContextState::kActive));
  EXPECT_FALSE(cuda::should_restore_device(2, 2, ContextState::kActive))
      << "nothing to restore";
  EXPECT_FALSE(cuda::should_restore_device(-1, 2, ContextState::kActive));
}

TEST(DeviceRule, ThreadWithoutGuardFailsOnlyWhenRequired) {
  // Device 0 everywhere: still a violation, because nothing set it.
  const std::string why = cuda::device_rule_violation(-1, 0, 0, true);
  EXPECT_NE(why.find("has not set its device through tutti"), std::string::npos) << why;
  EXPECT_EQ(cuda::device_rule_violation(-1, 0, 0, false), "");
}

TEST(DeviceRule, DevicesMustAgree) {
  EXPECT_EQ(cuda::device_rule_violation(1, 1, 1, true), "");
  EXPECT_EQ(cuda::device_rule_violation(0, 0, 0, true), "");
  const std::string moved = cuda::device_rule_violation(1, 0, 0, true);
  EXPECT_NE(moved.find("current device is 0 but the innermost cuda::DeviceGuard set 1"),
            std::string::npos)
      << moved;
  const std::string stream = cuda::device_rule_violation(1, 1, 2, true);
  EXPECT_NE(stream.find("stream belongs to device 2 but the current device is 1"),
            std::string::npos)
      << stream;
  EXPECT_NE(cuda::device_rule_violation(-1, 1, 2, false), "")
      << "a mismatch is reported even without the guard requirement";
}

TEST(ThreadDevice, ScopesNestAndStayOnTheirThread) {
  EXPECT_EQ(cuda::thread_device(), -1);
  {
    cuda::ThreadDeviceScope a(1);
    EXPECT_EQ(cuda::thread_device(), 1);
    int seen_by_fresh_thread = 99;
    std::thread([&] { seen_by_fresh_thread = cuda::thread_device(); }).join();
    EXPECT_EQ(seen_by_fresh_thread, -1) << "a fresh thread has set nothing";
    {
      cuda::ThreadDeviceScope b(3);
      EXPECT_EQ(cuda::thread_device(), 3);
    }
    EXPECT_EQ(cuda::thread_device(), 1);
  }
  EXPECT_EQ(cuda::thread_device(), -1);
}

TEST(ThreadDevice, OptionalGuardOnTheCpuSetsNothing) {
  cuda::OptionalDeviceGuard g(Device::cpu());
  EXPECT_EQ(cuda::thread_device(), -1);
}

TEST(PinnedHostBuffer, PlainMemoryWhenNoContextExists) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device exists (see test_device_gpu)";
  // No driver, no context: pinning would need one, so none is made.
  HostBuffer b(4096, /*pinned=*/true);
  EXPECT_FALSE(b.pinned());
  ASSERT_NE(b.data(), nullptr);
  b.as<char>()[4095] = 7;
  EXPECT_EQ(b.as<char>()[4095], 7);
}

TEST(DeviceCheckSwitch, FollowsTheSettingAfterReload) {
  const char* old = std::getenv("TUTTI_CHECK_DEVICE");
  const std::string saved = old ? old : "";
  setenv("TUTTI_CHECK_DEVICE", "1", 1);
  config::reload();
  EXPECT_TRUE(cuda::device_check_enabled());
  setenv("TUTTI_CHECK_DEVICE", "0", 1);
  config::reload();
  EXPECT_FALSE(cuda::device_check_enabled());
  setenv("TUTTI_CHECK_DEVICE", "maybe", 1);
  config::reload();
  EXPECT_THROW(cuda::device_check_enabled(), Error);
  if (old)
    setenv("TUTTI_CHECK_DEVICE", saved.c_str(), 1);
  else
    unsetenv("TUTTI_CHECK_DEVICE");
  config::reload();
}

}  // namespace
}  // namespace tutti
