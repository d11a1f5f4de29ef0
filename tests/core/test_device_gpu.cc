// Device discipline on a GPU (label gpu; skipped without a device):
//  * a kernel launched from a fresh std::thread that never set its device
//    fails check_launch under TUTTI_CHECK_DEVICE=1, even though device 0 is
//    the right one on a one-GPU machine; the same launch under a
//    DeviceGuard passes;
//  * a DeviceGuard on a fresh thread leaves no context behind on a device
//    the process does not use (two GPUs needed to observe it: device 0's
//    primary context must stay inactive while the thread works on device 1);
//  * the driver entry point answers (kUnknown would silently disable the
//    restore logic).
// This executable holds only these tests, so device 0's context state at its
// start is what tutti::init() and the test main left.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "core/cuda_utils.h"
#include "core/host_buffer.h"
#include "tutti/config.h"
#include "tutti/process_group.h"

#if TUTTI_WITH_CUDA
#include "kernels/compression_common.h"

namespace tutti {
namespace {

// TUTTI_CHECK_DEVICE=1 for the test's scope.
class StrictDeviceCheck {
 public:
  StrictDeviceCheck() {
    const char* old = std::getenv("TUTTI_CHECK_DEVICE");
    had_ = old != nullptr;
    if (old) saved_ = old;
    setenv("TUTTI_CHECK_DEVICE", "1", 1);
    config::reload();
  }
  ~StrictDeviceCheck() {
    if (had_)
      setenv("TUTTI_CHECK_DEVICE", saved_.c_str(), 1);
    else
      unsetenv("TUTTI_CHECK_DEVICE");
    config::reload();
  }

 private:
  bool had_ = false;
  std::string saved_;
};

// Runs `fn` on a fresh thread; returns the message of the tutti::Error it
// threw ("" if none).
template <typename Fn>
std::string error_on_fresh_thread(Fn fn) {
  std::string what;
  std::thread([&] {
    try {
      fn();
    } catch (const Error& e) {
      what = e.what();
    }
  }).join();
  return what;
}

// Declared first: nothing in this process may have touched device 0 yet.
TEST(DeviceGuardGpu, FreshThreadGuardCreatesNoContextOnDevice0) {
  TUTTI_REQUIRE_GPU();
  ASSERT_NE(cuda::primary_context_state(0), cuda::ContextState::kUnknown)
      << "cuDevicePrimaryCtxGetState not reachable through "
         "cudaGetDriverEntryPointByVersion: the guard could never restore";
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs two GPUs: with one, the guard's device is device 0";
  if (cuda::primary_context_state(0) == cuda::ContextState::kActive)
    GTEST_SKIP() << "device 0 already has a context in this process";
  int after = -1, inside_thread_device = -1;
  std::thread([&] {
    {
      cuda::DeviceGuard g(1);
      inside_thread_device = cuda::thread_device();
      cuda::DeviceBuffer b(1, 1024);  // real work on device 1
      TUTTI_CUDA_CHECK(cudaMemset(b.data(), 0, 1024));
      TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
    }
    TUTTI_CUDA_CHECK(cudaGetDevice(&after));
  }).join();
  EXPECT_EQ(inside_thread_device, 1);
  EXPECT_EQ(cuda::primary_context_state(0), cuda::ContextState::kInactive)
      << "the guard's destructor made device 0 current and created its context";
  EXPECT_EQ(after, 1) << "with device 0 unused, the thread stays on its device";
  EXPECT_EQ(cuda::primary_context_state(1), cuda::ContextState::kActive);
}

TEST(DeviceGuardGpu, RestoresADeviceThatHasAContext) {
  TUTTI_REQUIRE_GPU();
  const int dev = local_rank() % cuda_device_count();
  std::thread([&] {
    cuda::DeviceGuard outer(dev);
    TUTTI_CUDA_CHECK(cudaFree(nullptr));  // make sure the context exists
    EXPECT_EQ(cuda::primary_context_state(dev), cuda::ContextState::kActive);
    if (cuda_device_count() >= 2) {
      const int other = (dev + 1) % cuda_device_count();
      {
        cuda::DeviceGuard inner(other);
        EXPECT_EQ(cuda::thread_device(), other);
      }
      int now = -1;
      TUTTI_CUDA_CHECK(cudaGetDevice(&now));
      EXPECT_EQ(now, dev) << "the outer device is active, so it is restored";
    }
    EXPECT_EQ(cuda::thread_device(), dev);
  }).join();
  EXPECT_EQ(cuda::thread_device(), -1) << "guards of another thread leave this one alone";
}

TEST(DeviceGuardGpu, PinnedHostBufferUsesAnExistingContext) {
  TUTTI_REQUIRE_GPU();
  const int dev = local_rank() % cuda_device_count();
  {
    cuda::DeviceGuard g(dev);
    TUTTI_CUDA_CHECK(cudaFree(nullptr));  // the process now has a context on dev
  }
  const bool device0_unused = dev != 0 &&
      cuda::primary_context_state(0) == cuda::ContextState::kInactive;
  std::unique_ptr<HostBuffer> b;
  std::thread([&] { b.reset(new HostBuffer(1 << 20, /*pinned=*/true)); }).join();
  EXPECT_TRUE(b->pinned()) << "a context exists on cuda:" << dev;
  std::thread([&] { b.reset(); }).join();  // freed on yet another fresh thread
  if (device0_unused)
    EXPECT_EQ(cuda::primary_context_state(0), cuda::ContextState::kInactive)
        << "pinning or freeing on a fresh thread created a context on device 0";
}

// Host-to-device copies that set-up paths rely on (checkpoint loads, the
// PowerSGD warm start, TP parameter loads, the Python bindings): the bytes
// must be on the device when the copy returns, so that a kernel on a
// non-blocking stream reads them.  A plain cudaMemcpy from pageable memory
// may return before its DMA lands (CUDA's API synchronization behavior).
// The large buffer is staged in chunks, so the last chunk's DMA is what a
// reader can overtake; the raw cudaMemcpy's stale bytes are reported, not
// asserted (a race need not show).  On an H100 (2026-11-27, two runs) the
// plain copy left none stale here nor in the small-upload case below.
TEST(CopyToDeviceGpu, BytesHaveLandedForANonBlockingStream) {
  TUTTI_REQUIRE_GPU();
  const int dev = local_rank() % cuda_device_count();
  cuda::DeviceGuard g(dev);
  const size_t n = size_t{64} << 20;  // floats: 256 MiB
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000003) + 0.5f;
  cuda::DeviceBuffer dst(dev, n * 4), seen(dev, n * 4);
  cudaStream_t reader;
  TUTTI_CUDA_CHECK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
  std::vector<float> back(n);
  auto stale_after = [&](bool sync_copy) {
    TUTTI_CUDA_CHECK(cudaMemset(dst.data(), 0, n * 4));
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
    if (sync_copy)
      cuda::copy_to_device_sync(dst.data(), host.data(), n * 4);
    else
      TUTTI_CUDA_CHECK(cudaMemcpy(dst.data(), host.data(), n * 4, cudaMemcpyHostToDevice));
    // Read at once on the non-blocking stream, as the reducer, the
    // compressors and the layers do.
    TUTTI_CUDA_CHECK(cudaMemcpyAsync(seen.data(), dst.data(), n * 4,
                                     cudaMemcpyDeviceToDevice, reader));
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(reader));
    TUTTI_CUDA_CHECK(cudaMemcpy(back.data(), seen.data(), n * 4, cudaMemcpyDeviceToHost));
    size_t stale = 0;
    for (size_t i = 0; i < n; ++i) stale += back[i] != host[i];
    return stale;
  };
  size_t raw_stale = 0;
  for (int round = 0; round < 3; ++round) {
    raw_stale += stale_after(false);
    EXPECT_EQ(stale_after(true), 0u) << "round " << round;
  }
  std::printf("plain cudaMemcpy from pageable memory: %zu of %zu floats stale when a "
              "non-blocking stream read them at once (3 rounds)\n", raw_stale, 3 * n);
  TUTTI_CUDA_CHECK(cudaStreamDestroy(reader));
}

// The same with many small uploads (gradients of a few dozen bytes, as in
// test_zero_gpu), each read at once by a non-blocking stream into its own
// slot: small pageable copies are staged and returned from soonest.
TEST(CopyToDeviceGpu, SmallUploadsHaveLandedForANonBlockingStream) {
  TUTTI_REQUIRE_GPU();
  const int dev = local_rank() % cuda_device_count();
  cuda::DeviceGuard g(dev);
  const int uploads = 2000;
  const size_t n = 16;  // floats per upload
  cuda::DeviceBuffer dst(dev, n * 4), seen(dev, uploads * n * 4);
  cudaStream_t reader;
  TUTTI_CUDA_CHECK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
  std::vector<float> host(n), back(uploads * n);
  auto stale_after = [&](bool sync_copy) {
    TUTTI_CUDA_CHECK(cudaMemset(seen.data(), 0, uploads * n * 4));
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
    for (int u = 0; u < uploads; ++u) {
      for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(u * 100 + i) + 0.5f;
      if (sync_copy)
        cuda::copy_to_device_sync(dst.data(), host.data(), n * 4);
      else
        TUTTI_CUDA_CHECK(cudaMemcpy(dst.data(), host.data(), n * 4, cudaMemcpyHostToDevice));
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(static_cast<float*>(seen.data()) + u * n, dst.data(),
                                       n * 4, cudaMemcpyDeviceToDevice, reader));
      // The next upload overwrites dst: the reader must have read it first
      // (this orders the test itself, not the copy under test).
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(reader));
    }
    TUTTI_CUDA_CHECK(cudaMemcpy(back.data(), seen.data(), back.size() * 4,
                                cudaMemcpyDeviceToHost));
    size_t stale = 0;
    for (int u = 0; u < uploads; ++u)
      for (size_t i = 0; i < n; ++i)
        stale += back[u * n + i] != static_cast<float>(u * 100 + i) + 0.5f;
    return stale;
  };
  const size_t raw_stale = stale_after(false);
  EXPECT_EQ(stale_after(true), 0u);
  std::printf("plain cudaMemcpy from pageable memory, %d uploads of %zu bytes: %zu of %zu "
              "floats stale when a non-blocking stream read them at once\n",
              uploads, n * 4, raw_stale, uploads * n);
  TUTTI_CUDA_CHECK(cudaStreamDestroy(reader));
}

class LaunchOnFreshThread : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    dev = local_rank() % cuda_device_count();
    src = cuda::DeviceBuffer(dev, n * sizeof(float));
    dst = cuda::DeviceBuffer(dev, n * sizeof(float));
    cuda::DeviceGuard g(dev);
    TUTTI_CUDA_CHECK(cudaMemset(src.data(), 0, n * sizeof(float)));
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void launch(cudaStream_t s) {
    kernels::launch_load_f32(src.data(), DType::kFloat32, static_cast<float*>(dst.data()), n, s);
  }
  static constexpr int64_t n = 1000;
  int dev = 0;
  cuda::DeviceBuffer src, dst;
};

TEST_F(LaunchOnFreshThread, WithoutAGuardFailsTheCheck) {
  StrictDeviceCheck strict;
  // Device `dev` would only be current by accident (0 on a fresh thread):
  // set it the wrong way, with a bare cudaSetDevice, so the launch itself
  // is fine and only the discipline check can object.
  const std::string what = error_on_fresh_thread([&] {
    TUTTI_CUDA_CHECK(cudaSetDevice(dev));
    launch(nullptr);
  });
  EXPECT_NE(what.find("has not set its device through tutti"), std::string::npos) << what;
  EXPECT_NE(what.find("compression_common.cu"), std::string::npos)
      << "the error names the launcher: " << what;
}

TEST_F(LaunchOnFreshThread, UnderAGuardPasses) {
  StrictDeviceCheck strict;
  cuda::Stream stream(dev);
  const std::string what = error_on_fresh_thread([&] {
    cuda::DeviceGuard g(dev);
    launch(nullptr);        // legacy stream: the current device's
    launch(stream.get());   // the stream's device is the guard's
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  });
  EXPECT_EQ(what, "");
}

TEST_F(LaunchOnFreshThread, StreamOfAnotherDeviceFails) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  StrictDeviceCheck strict;
  const int other = (dev + 1) % cuda_device_count();
  cuda::Stream stream(other);
  const std::string what = error_on_fresh_thread([&] {
    cuda::DeviceGuard g(dev);
    launch(stream.get());
  });
  EXPECT_NE(what.find("stream belongs to device"), std::string::npos) << what;
}

TEST_F(LaunchOnFreshThread, EventWithoutAGuardFailsTheCheck) {
  StrictDeviceCheck strict;
  const std::string what = error_on_fresh_thread([] { cuda::Event e; });
  EXPECT_NE(what.find("cuda::Event created on a thread"), std::string::npos) << what;
  EXPECT_EQ(error_on_fresh_thread([&] { cuda::Event e(dev); }), "");
}

}  // namespace
}  // namespace tutti

#else

TEST(DeviceGuardGpu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif
