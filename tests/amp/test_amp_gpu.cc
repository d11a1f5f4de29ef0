// CUDA multi-tensor kernels against the host twins on fresh random data
// with planted NaN/Inf/subnormals/large values: many tensor counts (below,
// at and above a launch's slot limit), sizes (0, 1, odd, chunk boundaries,
// several launches for one tensor), mixed dtypes, misaligned views.
// Outputs are poisoned first.  Label gpu: skipped without a device.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "amp_test_util.h"
#include "common/test_util.h"
#include "kernels/amp_multi_tensor.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>

namespace tutti {
namespace amp {
namespace {

using test::HostTensor;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device memory holding a copy of a host tensor, viewed at an element
// offset (offset 1 misaligns vector access).
struct DeviceTensor {
  DType dtype;
  int64_t n;
  int64_t offset;
  void* base = nullptr;
  DeviceTensor(const HostTensor& h, int64_t off) : dtype(h.dtype), n(h.numel()), offset(off) {
    const size_t bytes = (n + off) * dtype_size(dtype);
    EXPECT_EQ(cudaMalloc(&base, bytes == 0 ? 1 : bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(base); }
  DeviceTensor(const DeviceTensor&) = delete;
  void* ptr() const { return static_cast<char*>(base) + offset * dtype_size(dtype); }
  Tensor tensor() const { return Tensor(n ? ptr() : nullptr, dtype, Shape{n}, Device::cuda(0)); }
  HostTensor to_host() const {
    HostTensor h(dtype, n);
    EXPECT_EQ(cudaMemcpy(h.bytes.data(), ptr(), h.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }
};

int64_t random_size(std::mt19937* rng, int kind) {
  const int64_t c = MtaTable::kChunk;
  switch (kind) {
    case 0: return (*rng)() % 18;                       // 0..17
    case 1: return c + static_cast<int64_t>((*rng)() % 3) - 1;  // chunk boundary
    case 2: return (*rng)() % 100000;
    default: return (*rng)() % (4 * c) + 1;
  }
}

class GpuAmp : public ::testing::Test {
 protected:
  void SetUp() override { TUTTI_REQUIRE_GPU(); }
};

TEST_F(GpuAmp, ScaleCopyMatchesHostTwin) {
  std::mt19937 rng(21);
  const float scales[] = {1.0f, 1.0f / 65536, 0.3f, 8.0f};
  for (int count : {1, 2, 47, 48, 49, 130}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<HostTensor> src, ref;
      std::vector<std::unique_ptr<DeviceTensor>> dsrc, ddst;
      std::vector<Tensor> hs, hd, ds, dd;
      for (int i = 0; i < count; ++i) {
        const int64_t n = random_size(&rng, kind);
        const DType sd = test::kAmpDTypes[rng() % 3], dt = test::kAmpDTypes[rng() % 3];
        src.emplace_back(sd, n);
        test::fill_random(&src.back(), &rng, 50.0f, rng() % 2 == 0);
        ref.emplace_back(dt, n);
        ref.back().poison();
        HostTensor poisoned(dt, n);
        poisoned.poison();
        dsrc.push_back(std::make_unique<DeviceTensor>(src.back(), rng() % 2));
        ddst.push_back(std::make_unique<DeviceTensor>(poisoned, rng() % 2));
      }
      for (int i = 0; i < count; ++i) {
        hs.push_back(src[i].tensor());
        hd.push_back(ref[i].tensor());
        ds.push_back(dsrc[i]->tensor());
        dd.push_back(ddst[i]->tensor());
      }
      const float scale = scales[rng() % 4];
      const NonFiniteReport host = scale_copy(hs, hd, scale);
      const NonFiniteReport dev = scale_copy(ds, dd, scale);
      EXPECT_EQ(dev.found, host.found);
      EXPECT_EQ(dev.tensors, host.tensors) << "count " << count << " kind " << kind;
      for (int i = 0; i < count; ++i)
        ASSERT_TRUE(test::same_values(ddst[i]->to_host(), ref[i]))
            << "count " << count << " kind " << kind << " tensor " << i;
    }
  }
}

TEST_F(GpuAmp, InPlaceUnscaleAndReadOnlyCheck) {
  std::mt19937 rng(22);
  std::vector<HostTensor> host;
  std::vector<std::unique_ptr<DeviceTensor>> dev;
  std::vector<Tensor> hv, dv;
  for (int i = 0; i < 60; ++i) {
    host.emplace_back(test::kAmpDTypes[i % 3], random_size(&rng, i % 4));
    test::fill_random(&host.back(), &rng, 1000.0f, i % 5 == 0);
    dev.push_back(std::make_unique<DeviceTensor>(host.back(), i % 2));
  }
  for (int i = 0; i < 60; ++i) {
    hv.push_back(host[i].tensor());
    dv.push_back(dev[i]->tensor());
  }
  // Read-only: no byte changes, same report.
  std::vector<HostTensor> before;
  for (auto& d : dev) before.push_back(d->to_host());
  const NonFiniteReport hc = check_finite(hv), dc = check_finite(dv);
  EXPECT_EQ(dc.tensors, hc.tensors);
  for (int i = 0; i < 60; ++i) EXPECT_EQ(dev[i]->to_host().bytes, before[i].bytes) << i;
  // In place.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const NonFiniteReport hu = unscale_and_check(hv, 1.0f / 4096);
  const NonFiniteReport du = unscale_and_check(dv, 1.0f / 4096, stream);
  EXPECT_EQ(du.tensors, hu.tensors);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(test::same_values(dev[i]->to_host(), host[i])) << i;
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(GpuAmp, OneTensorAcrossSeveralLaunches) {
  // More chunks than one launch holds.
  const int64_t n = MtaTable::kChunk * (MtaTable::kMaxBlocks + 5) + 3;
  HostTensor h(DType::kFloat16, n);
  std::mt19937 rng(23);
  test::fill_random(&h, &rng, 100.0f, false);
  h.set(n - 1, std::numeric_limits<float>::infinity());
  DeviceTensor d(h, 0);
  const NonFiniteReport hr = unscale_and_check({h.tensor()}, 0.5f);
  const NonFiniteReport dr = unscale_and_check({d.tensor()}, 0.5f);
  EXPECT_TRUE(dr.found);
  EXPECT_EQ(dr.tensors, hr.tensors);
  EXPECT_TRUE(test::same_values(d.to_host(), h));
  const TensorNorms hn = multi_tensor_norms({h.tensor()});
  const TensorNorms dn = multi_tensor_norms({d.tensor()});
  EXPECT_TRUE(std::isinf(dn.sum_squares[0]));
  EXPECT_EQ(dn.max_abs[0], hn.max_abs[0]);
}

TEST_F(GpuAmp, NormsMatchHostTwin) {
  std::mt19937 rng(24);
  for (int count : {1, 3, 48, 49, 100}) {
    std::vector<HostTensor> host;
    std::vector<std::unique_ptr<DeviceTensor>> dev;
    std::vector<Tensor> hv, dv;
    for (int i = 0; i < count; ++i) {
      host.emplace_back(test::kAmpDTypes[rng() % 3], random_size(&rng, i % 4));
      test::fill_random(&host.back(), &rng, 3.0f, i % 7 == 3);
      dev.push_back(std::make_unique<DeviceTensor>(host.back(), i % 2));
    }
    // A large finite float32 tensor exercises the prescaled second pass.
    host.emplace_back(DType::kFloat32, 5000);
    for (int64_t k = 0; k < 5000; ++k) host.back().set(k, k % 2 ? 1e30f : -2e29f);
    dev.push_back(std::make_unique<DeviceTensor>(host.back(), 0));
    for (size_t i = 0; i < host.size(); ++i) {
      hv.push_back(host[i].tensor());
      dv.push_back(dev[i]->tensor());
    }
    const TensorNorms hn = multi_tensor_norms(hv), dn = multi_tensor_norms(dv);
    for (size_t i = 0; i < host.size(); ++i) {
      const double h = hn.sum_squares[i], d = dn.sum_squares[i];
      if (std::isnan(h) || std::isinf(h)) {
        EXPECT_EQ(std::isnan(d), std::isnan(h)) << i;
        EXPECT_EQ(std::isinf(d), std::isinf(h)) << i;
      } else {
        // Both accumulate at most a few hundred float32 terms per partial.
        EXPECT_NEAR(d, h, 2e-5 * h) << "count " << count << " tensor " << i;
      }
      if (std::isnan(hn.max_abs[i]))
        EXPECT_TRUE(std::isnan(dn.max_abs[i])) << i;
      else
        EXPECT_EQ(dn.max_abs[i], hn.max_abs[i]) << i;
    }
  }
}

TEST_F(GpuAmp, ClipAndScalerOnDeviceGradients) {
  std::mt19937 rng(25);
  HostTensor a(DType::kFloat16, 70001), b(DType::kFloat32, 33);
  test::fill_random(&a, &rng, 4.0f, false);
  test::fill_random(&b, &rng, 4.0f, false);
  DeviceTensor da(a, 0), db(b, 1);
  ClipOptions o;
  o.group = world().get();
  const ClipResult hr = clip_grad_norm({a.tensor(), b.tensor()}, 1.0, o);
  const ClipResult dr = clip_grad_norm({da.tensor(), db.tensor()}, 1.0, o);
  EXPECT_NEAR(dr.total_norm, hr.total_norm, 1e-5 * hr.total_norm);
  EXPECT_TRUE(dr.clipped);
  DynamicLossScaler scaler;
  StepCheckOptions c;
  c.groups = {world().get()};
  EXPECT_FALSE(scaler.unscale_and_check({da.tensor(), db.tensor()}, c));
  scaler.update();
}

}  // namespace
}  // namespace amp
}  // namespace tutti

#else  // !TUTTI_WITH_CUDA

TEST(GpuAmp, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif  // TUTTI_WITH_CUDA
