// Every compressor on CUDA buckets against the same compressor on host
// buckets: the results agree within the kernels' tolerance, and the CUDA
// results are bit-identical on every rank (labelled gpu).  Where ranks share
// a GPU the CUDA buckets go over the staged transport, which reduces with
// the host path's MPI ops: there "none", "fp16", "bf16" and "topk" (whose
// kernels compute what their CPU twins do: casts rounded once, top-k's
// selection and fixed-order decoding) must equal the host results bit for
// bit, error feedback included, over three steps.  The CUDA compressor runs
// on a fresh thread, as under the reducer's bucket worker: it must set the
// bucket's device itself.  A last step overflows on rank 0 only and must
// come out NaN on every rank (the on-device agreement flag).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/test_util.h"
#include "compression/compression_test_util.h"

#if TUTTI_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti {
namespace {

#if TUTTI_WITH_CUDA

class GpuCompressors : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuCompressors, MatchHostAndAreIdenticalOnEveryRank) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto w = world();
  // Ranks may share a device (the staged transport serves them).
  const int dev = local_rank() % cuda_device_count();
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
  const bool exact = test::gpu_transport() == "staged" &&
                     (GetParam() == "none" || GetParam() == "fp16" || GetParam() == "bf16" ||
                      GetParam() == "topk");
  CompressorOptions o;
  o.topk_ratio = 0.05;
  o.onebit_chunk = 64;
  o.auto_probe_steps = 2;
  const int64_t n = 20000;
  BucketLayout host_layout = test::make_layout(
      0, DType::kFloat32, n, {Shape{100, 150}, Shape{3000}, Shape{10, 50}});
  BucketLayout dev_layout = host_layout;
  dev_layout.device = Device::cuda(dev);
  auto on_host = make_compressor(GetParam(), o);
  auto on_dev = make_compressor(GetParam(), o);
  on_host->setup(host_layout);
  on_dev->setup(dev_layout);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * 4), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int64_t step = 0; step < 3; ++step) {
    test::HostBucket h(DType::kFloat32, n);
    h.set(test::gradient_values(n, DType::kFloat32, 8, w->rank(), step));
    ASSERT_EQ(cudaMemcpy(d, h.bytes.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    CompressContext ctx;
    ctx.comm = w.get();
    ctx.step = step;
    on_host->allreduce(0, h.tensor(), ctx);
    ctx.stream = stream;
    std::thread worker([&] {  // a thread whose device nobody set
      on_dev->allreduce(0, Tensor(d, DType::kFloat32, Shape{n}, Device::cuda(dev)), ctx);
    });
    worker.join();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    auto all = test::gather_all(got.data(), n * 4);
    for (auto& a : all) ASSERT_TRUE(a == all[0]) << "CUDA results differ across ranks";
    if (GetParam() == "auto") continue;  // its choice may differ between the two
    if (exact) {
      ASSERT_EQ(std::memcmp(got.data(), h.bytes.data(), static_cast<size_t>(n) * 4), 0)
          << GetParam() << " step " << step
          << ": the staged CUDA result differs from the host result";
      continue;
    }
    const auto want = h.get();
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    // PowerSGD: cuBLAS vs OpenBLAS; 1-bit: the scales' summation order.
    const double tol = (GetParam() == "powersgd" ? 1e-3 : 1e-5) * (1 + scale);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], want[i], tol) << GetParam() << " step " << step << " at " << i;
  }
  // Overflow on rank 0 only.
  const std::string algo = GetParam();
  const bool error_feedback = algo == "topk" || algo == "onebit" || algo == "powersgd";
  if (error_feedback) {
    test::HostBucket h(DType::kFloat32, n);
    std::vector<double> v = test::gradient_values(n, DType::kFloat32, 8, w->rank(), 3);
    if (w->rank() == 0) v[17] = std::nan("");
    h.set(v);
    ASSERT_EQ(cudaMemcpy(d, h.bytes.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    CompressContext ctx;
    ctx.comm = w.get();
    ctx.step = 3;
    ctx.stream = stream;
    std::thread worker([&] {
      on_dev->allreduce(0, Tensor(d, DType::kFloat32, Shape{n}, Device::cuda(dev)), ctx);
    });
    worker.join();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isnan(got[i])) << algo << " at " << i;
    EXPECT_EQ(on_dev->stats().nonfinite_steps, 1u);
  }
  cudaStreamDestroy(stream);
  cudaFree(d);
}

INSTANTIATE_TEST_SUITE_P(All, GpuCompressors,
                         ::testing::Values("none", "fp16", "bf16", "topk",
                                           "powersgd", "onebit", "auto"));

#else

TEST(GpuCompressors, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif  // TUTTI_WITH_CUDA

}  // namespace
}  // namespace tutti
