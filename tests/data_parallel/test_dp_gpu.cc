// CUDA variants (label gpu; skipped without a device): the fused write-back
// kernel against its CPU twin on fresh random inputs with poisoned outputs,
// and the reducer on CUDA gradients (NCCL, user streams, unused gradients,
// hierarchical), plus parameter broadcast on CUDA tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/cuda_utils.h"
#include "data_parallel/dp_test_util.h"
#include "data_parallel/unflatten.h"

namespace tutti {
namespace {

#if TUTTI_WITH_CUDA

using test::Buffer;

int my_device() { return local_rank() % cuda_device_count(); }

// A device copy of a host Buffer.
struct DeviceArray {
  DType dtype;
  int64_t numel;
  cuda::DeviceBuffer mem;
  DeviceArray(const Buffer& host, int device)
      : dtype(host.dtype), numel(host.numel()), mem(device, host.bytes.size()) {
    if (!host.bytes.empty())
      TUTTI_CUDA_CHECK(cudaMemcpy(mem.data(), host.bytes.data(), host.bytes.size(),
                                  cudaMemcpyHostToDevice));
  }
  Tensor tensor(Shape s) const { return Tensor(mem.data(), dtype, s, Device::cuda(mem.device())); }
  Buffer download() const {
    Buffer b(dtype, numel);
    if (!b.bytes.empty())
      TUTTI_CUDA_CHECK(cudaMemcpy(b.bytes.data(), mem.data(), b.bytes.size(),
                                  cudaMemcpyDeviceToHost));
    return b;
  }
};

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                         DType::kInt8,    DType::kUInt8,   DType::kInt32,    DType::kInt64};

TEST(DpGpu, UnflattenKernelMatchesCpuTwin) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1000, 1000);
  for (DType d : kDTypes) {
    for (int64_t div : {1, 3, 4}) {
      const int64_t sizes[] = {70000, 1, 0, 33333};  // several chunks per slot
      int64_t total = 0;
      for (int64_t n : sizes) total += n;
      Buffer flat(d, total);
      flat.fill([&](int64_t) { return d == DType::kUInt8 ? std::fabs(u(rng)) / 4 : u(rng); });
      DeviceArray dflat(flat, dev);
      std::vector<Buffer> host_out;
      std::vector<std::unique_ptr<DeviceArray>> dev_out;
      std::vector<dp::UnflattenSlot> host_slots, dev_slots;
      int64_t off = 0;
      for (int64_t n : sizes) {
        host_out.emplace_back(d, n);
        host_out.back().fill([](int64_t) { return 77.0; });  // poison
        dev_out.emplace_back(new DeviceArray(host_out.back(), dev));
        host_slots.push_back({host_out.back().bytes.data(), off, n});
        dev_slots.push_back({dev_out.back()->mem.data(), off, n});
        off += n;
      }
      auto hc = dp::make_unflatten_chunks(d, host_slots);
      dp::unflatten_scale_cpu(flat.bytes.data(), d, hc.data(), hc.size(), div);
      auto dc = dp::make_unflatten_chunks(d, dev_slots);
      cuda::DeviceBuffer table(dev, dc.size() * sizeof(dc[0]));
      TUTTI_CUDA_CHECK(cudaMemcpy(table.data(), dc.data(), dc.size() * sizeof(dc[0]),
                                  cudaMemcpyHostToDevice));
      kernels::launch_unflatten_scale(dflat.mem.data(), d,
                                      static_cast<const kernels::UnflattenChunk*>(table.data()),
                                      static_cast<int>(dc.size()), div, stream.get());
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      for (size_t s = 0; s < host_out.size(); ++s) {
        const Buffer got = dev_out[s]->download();
        EXPECT_EQ(got.bytes, host_out[s].bytes)
            << dtype_name(d) << " / " << div << " slot " << s << ": kernel != CPU twin";
      }
    }
  }
}

struct GpuParam {
  std::string name;
  Shape shape;
  Buffer host;
  std::unique_ptr<DeviceArray> param, grad;
};

std::vector<GpuParam> gpu_params(int dev) {
  const std::vector<test::ParamDecl> decls = {{"w", DType::kFloat32, Shape{100, 30}},
                                              {"b", DType::kFloat32, Shape{30}},
                                              {"h", DType::kBFloat16, Shape{37}},
                                              {"d", DType::kFloat64, Shape{5}}};
  std::vector<GpuParam> out;
  for (const auto& d : decls) {
    GpuParam p{d.name, d.shape, Buffer(d.dtype, d.shape.numel()), nullptr, nullptr};
    p.param.reset(new DeviceArray(p.host, dev));
    p.grad.reset(new DeviceArray(p.host, dev));
    out.push_back(std::move(p));
  }
  return out;
}

class DpGpuReducer : public ::testing::TestWithParam<std::tuple<double, bool>> {};

TEST_P(DpGpuReducer, ClosedFormWithUnusedGradients) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  auto params = gpu_params(dev);
  ReducerOptions o;
  o.bucket_cap_mb = std::get<0>(GetParam());
  o.hierarchical = std::get<1>(GetParam());
  o.hierarchical_node_size = 1;
  Reducer r(world(), o);
  for (auto& p : params) r.add_parameter(p.name, p.param->tensor(p.shape), p.grad->tensor(p.shape));
  r.build();
  const int rank = world()->rank(), n = world()->size();
  auto used = [](int k, int p) { return !(k == 1 && p == 2); };
  for (int step = 0; step < 2; ++step) {
    for (size_t p = 0; p < params.size(); ++p) {
      Buffer h(params[p].host.dtype, params[p].host.numel());
      h.fill([&](int64_t i) { return test::grad_value(rank, static_cast<int>(p) + step, i); });
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(params[p].grad->mem.data(), h.bytes.data(), h.bytes.size(),
                                       cudaMemcpyHostToDevice, stream.get()));
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    }
    for (int i = r.num_parameters() - 1; i >= 0; --i)
      if (used(rank, i)) r.grad_ready(i, stream.get());
    EXPECT_TRUE(r.synchronize(stream.get()));
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    for (size_t p = 0; p < params.size(); ++p) {
      const Buffer got = params[p].grad->download();
      EXPECT_TRUE(test::matches(got, [&](int64_t i) {
        double sum = 0;
        for (int k = 0; k < n; ++k)
          if (used(k, static_cast<int>(p)))
            sum += test::stored(got.dtype, test::grad_value(k, static_cast<int>(p) + step, i));
        return test::expected_avg(got.dtype, sum, n);
      })) << params[p].name << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CapsAndModes, DpGpuReducer,
                         ::testing::Combine(::testing::Values(1e-9, 1000.0),
                                            ::testing::Values(false, true)));

TEST(DpGpu, BroadcastParameters) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  auto params = gpu_params(dev);
  Reducer r(world());
  for (auto& p : params) r.add_parameter(p.name, p.param->tensor(p.shape), p.grad->tensor(p.shape));
  r.build();
  const int rank = world()->rank();
  for (auto& p : params) {
    Buffer h(p.host.dtype, p.host.numel());
    h.fill([&](int64_t i) { return static_cast<double>((rank * 7 + i) % 50); });
    TUTTI_CUDA_CHECK(cudaMemcpy(p.param->mem.data(), h.bytes.data(), h.bytes.size(),
                                cudaMemcpyHostToDevice));
  }
  r.broadcast_parameters(0);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& p : params)
    EXPECT_TRUE(test::matches(p.param->download(),
                              [](int64_t i) { return static_cast<double>(i % 50); }));
}

#else

TEST(DpGpu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace tutti
