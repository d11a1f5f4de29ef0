// Checkpoint load into CUDA tensors (label gpu; skipped without a device):
// the double-buffered staging of src/checkpoint/device_upload.h, from
// /dev/shm (mapped shards) and from a disk directory (pread).  A 40 MB
// tensor (several 16 MiB staging chunks, the last one partial), small ones
// gathered into one chunk, an empty one and a host tensor come back with
// their exact values, read on a non-blocking stream right after load
// returns (the bytes must already be on the device); a flipped bit in the
// newest checkpoint falls back to the previous one, exactly.
#include <gtest/gtest.h>

#include <linux/magic.h>
#include <sys/vfs.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/file_util.h"
#include "ckpt_test_util.h"
#include "common/test_util.h"
#include "core/cuda_utils.h"

#if TUTTI_WITH_CUDA

namespace tutti {
namespace {

using test::ScratchDir;

// Element i of tensor k at `seed`, exact in every dtype used here.
int64_t value(uint64_t seed, size_t k, size_t i) {
  return static_cast<int64_t>((seed * 1000003 + k * 7919 + i * 31) % 1000000);
}

struct CudaState : Stateful {
  struct T {
    DType dtype;
    size_t n;
    bool cuda;
    void* ptr = nullptr;
    std::vector<unsigned char> host;
  };
  std::vector<T> ts;
  int dev;
  explicit CudaState(int device) : dev(device) {
    ts.push_back({DType::kFloat32, 10000003, true});
    ts.push_back({DType::kInt32, 1000, true});
    ts.push_back({DType::kFloat64, 7, true});
    ts.push_back({DType::kFloat32, 0, true});
    ts.push_back({DType::kInt64, 4099, false});
    cuda::DeviceGuard g(dev);
    for (T& t : ts) {
      const size_t bytes = std::max<size_t>(1, t.n * dtype_size(t.dtype));
      if (t.cuda) TUTTI_CUDA_CHECK(cudaMalloc(&t.ptr, bytes));
      else { t.host.resize(bytes); t.ptr = t.host.data(); }
    }
  }
  ~CudaState() {
    cuda::DeviceGuard g(dev);
    for (T& t : ts)
      if (t.cuda) cudaFree(t.ptr);
  }
  static std::vector<unsigned char> bytes_of(const T& t, size_t k, uint64_t seed) {
    std::vector<unsigned char> b(t.n * dtype_size(t.dtype));
    for (size_t i = 0; i < t.n; ++i) {
      const int64_t v = value(seed, k, i);
      switch (t.dtype) {
        case DType::kFloat32: { const float x = static_cast<float>(v); std::memcpy(&b[i * 4], &x, 4); break; }
        case DType::kFloat64: { const double x = static_cast<double>(v); std::memcpy(&b[i * 8], &x, 8); break; }
        case DType::kInt32: { const int32_t x = static_cast<int32_t>(v); std::memcpy(&b[i * 4], &x, 4); break; }
        default: std::memcpy(&b[i * 8], &v, 8);
      }
    }
    return b;
  }
  // seed 0: every byte zero.
  void fill(uint64_t seed) {
    cuda::DeviceGuard g(dev);
    for (size_t k = 0; k < ts.size(); ++k) {
      T& t = ts[k];
      std::vector<unsigned char> b = seed ? bytes_of(t, k, seed)
                                          : std::vector<unsigned char>(t.n * dtype_size(t.dtype), 0);
      if (b.empty()) continue;
      if (t.cuda) TUTTI_CUDA_CHECK(cudaMemcpy(t.ptr, b.data(), b.size(), cudaMemcpyHostToDevice));
      else std::memcpy(t.ptr, b.data(), b.size());
    }
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Reads the device tensors on a fresh non-blocking stream, which orders
  // after nothing: what load left in flight would show as wrong bytes.
  ::testing::AssertionResult holds(uint64_t seed) {
    cuda::DeviceGuard g(dev);
    cudaStream_t s;
    TUTTI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<std::vector<unsigned char>> got(ts.size());
    for (size_t k = 0; k < ts.size(); ++k) {
      const T& t = ts[k];
      got[k].resize(t.n * dtype_size(t.dtype));
      if (got[k].empty()) continue;
      if (t.cuda)
        TUTTI_CUDA_CHECK(cudaMemcpyAsync(got[k].data(), t.ptr, got[k].size(),
                                         cudaMemcpyDeviceToHost, s));
      else std::memcpy(got[k].data(), t.ptr, got[k].size());
    }
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
    for (size_t k = 0; k < ts.size(); ++k)
      if (got[k] != bytes_of(ts[k], k, seed))
        return ::testing::AssertionFailure() << "tensor " << k << " differs from seed " << seed;
    return ::testing::AssertionSuccess();
  }
  StateDict state_dict() override {
    StateDict out;
    for (size_t k = 0; k < ts.size(); ++k) {
      const T& t = ts[k];
      out.push_back({"t" + std::to_string(k),
                     Tensor(t.ptr, t.dtype, Shape{static_cast<int64_t>(t.n)},
                            t.cuda ? Device::cuda(dev) : Device::cpu()),
                     {}});
    }
    return out;
  }
};

TEST(CheckpointCuda, LoadsExactValuesAndFallsBackFromRamAndDisk) {
  TUTTI_REQUIRE_GPU();
  auto w = world();
  const int dev = local_rank() % cuda_device_count();
  struct statfs fs {};
  std::vector<std::string> roots{"/tmp"};
  if (::statfs("/dev/shm", &fs) == 0 && static_cast<unsigned long>(fs.f_type) == TMPFS_MAGIC)
    roots.push_back("/dev/shm");
  for (const std::string& root : roots) {
    SCOPED_TRACE(root);
    ScratchDir tmp(w, root);
    CudaState st(dev);
    CheckpointOptions o;
    o.dir = tmp.path();
    o.async = false;
    CheckpointManager m(w, o);
    st.fill(11);
    m.save(1, {{"s", &st}});
    st.fill(22);
    m.save(2, {{"s", &st}});
    st.fill(0);
    auto r = m.load({{"s", &st}}, LoadOptions{2, {}, false});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 2);
    EXPECT_TRUE(st.holds(22));
    w->barrier();
    if (w->rank() == 0) {
      const std::string f = tmp.sub("step-00000002/rank-00000.safetensors");
      test::flip_bit(f, static_cast<int64_t>(ckpt::file_size(f) / 2));
    }
    w->barrier();
    st.fill(0);
    r = m.load({{"s", &st}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    EXPECT_TRUE(st.holds(11));
  }
}

}  // namespace
}  // namespace tutti

#endif  // TUTTI_WITH_CUDA
