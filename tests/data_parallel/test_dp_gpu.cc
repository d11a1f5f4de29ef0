// CUDA variants (label gpu; skipped without a device): the fused write-back
// kernel against its CPU twin on fresh random inputs with poisoned outputs,
// the reducer on CUDA gradients (NCCL with a GPU per rank, the staged
// transport where ranks share one; user streams, unused gradients,
// hierarchical at two node sizes), the reducer in compressed mode against
// the host reducer, over the staged transport the average bit for bit
// against the host reducer, and parameter broadcast on CUDA tensors.  All
// under TUTTI_CHECK_DEVICE=1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <random>
#include <thread>

#include "core/cuda_utils.h"
#include "data_parallel/dp_test_util.h"
#include "data_parallel/unflatten.h"
#include "tutti/compression.h"
#include "tutti/config.h"

namespace tutti {
namespace {

#if TUTTI_WITH_CUDA

using test::Buffer;

int my_device() { return local_rank() % cuda_device_count(); }

// Every test here runs under the device-discipline check (whatever the
// environment says): a reducer thread that launches a kernel without
// setting its device fails, even on device 0.
class StrictDeviceCheck : public ::testing::Environment {
 public:
  void SetUp() override {
    setenv("TUTTI_CHECK_DEVICE", "1", 1);
    config::reload();
  }
};
::testing::Environment* const kStrict =
    ::testing::AddGlobalTestEnvironment(new StrictDeviceCheck);

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

const std::vector<test::ParamDecl> kMixedDecls = {{"w", DType::kFloat32, Shape{100, 30}},
                                                  {"b", DType::kFloat32, Shape{30}},
                                                  {"h", DType::kBFloat16, Shape{37}},
                                                  {"d", DType::kFloat64, Shape{5}}};

std::vector<GpuParam> gpu_params(int dev,
                                 const std::vector<test::ParamDecl>& decls = kMixedDecls) {
  std::vector<GpuParam> out;
  for (const auto& d : decls) {
    GpuParam p{d.name, d.shape, Buffer(d.dtype, d.shape.numel()), nullptr, nullptr};
    p.param.reset(new DeviceArray(p.host, dev));
    p.grad.reset(new DeviceArray(p.host, dev));
    out.push_back(std::move(p));
  }
  return out;
}

// (bucket cap, hierarchical node size; 0: flat).  At np 2 node size 1 is
// the cross-node all-reduce alone, node size 2 the node reduce-scatter +
// all-gather (padded buckets); at np 1 the reducer is flat either way.
class DpGpuReducer : public ::testing::TestWithParam<std::tuple<double, int>> {};

TEST_P(DpGpuReducer, ClosedFormWithUnusedGradients) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  auto params = gpu_params(dev);
  ReducerOptions o;
  o.bucket_cap_mb = std::get<0>(GetParam());
  o.hierarchical = std::get<1>(GetParam()) > 0;
  o.hierarchical_node_size = std::get<1>(GetParam());
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
                                            ::testing::Values(0, 1, 2)));

// The same parameters on the host and on this rank's device, each with a
// reducer over the world.  step() gives both the same gradients (distinct
// values whose sums round) and runs one reducer's step, then the other's.
struct TwinReducers {
  TwinReducers(int dev, const std::vector<test::ParamDecl>& d, const ReducerOptions& host_o,
               const ReducerOptions& dev_o)
      : decls(d), host_params(test::make_params(d)), dev_params(gpu_params(dev, d)),
        on_host(world(), host_o), on_dev(world(), dev_o) {
    test::register_all(on_host, host_params);
    for (auto& p : dev_params)
      on_dev.add_parameter(p.name, p.param->tensor(p.shape), p.grad->tensor(p.shape));
    on_host.build();
    on_dev.build();
  }

  ::testing::AssertionResult step(int step, cudaStream_t stream) {
    const int rank = world()->rank();
    for (size_t p = 0; p < decls.size(); ++p) {
      auto value = [&](int64_t i) {
        return std::sin(0.37 * static_cast<double>(i) + 1.1 * rank + 7.0 * p + 1.3 * step) *
               (1.0 + static_cast<double>(i % 97) / 97.0);
      };
      host_params[p].grad.fill(value);
      dev_params[p].host.fill(value);
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(dev_params[p].grad->mem.data(),
                                       dev_params[p].host.bytes.data(),
                                       dev_params[p].host.bytes.size(),
                                       cudaMemcpyHostToDevice, stream));
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    // One reducer's step at a time: both use the world group, and a step in
    // flight must not interleave with other collectives on it.
    for (int i = on_host.num_parameters() - 1; i >= 0; --i) on_host.grad_ready(i);
    if (!on_host.synchronize()) return ::testing::AssertionFailure() << "host step " << step;
    for (int i = on_dev.num_parameters() - 1; i >= 0; --i) on_dev.grad_ready(i, stream);
    if (!on_dev.synchronize(stream)) return ::testing::AssertionFailure() << "device step " << step;
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream));
    return ::testing::AssertionSuccess();
  }

  std::vector<test::ParamDecl> decls;
  std::vector<test::TestParam> host_params;
  std::vector<GpuParam> dev_params;
  Reducer on_host, on_dev;
};

// The reducer in compressed mode on CUDA gradients against the same
// compressor on host gradients (the CPU twins), over three steps so error
// feedback carries over.  The compressor runs on the reducer's worker
// thread, which must set the bucket's device itself: under
// TUTTI_CHECK_DEVICE (on for this file) a kernel it launched without doing
// so fails even where device 0 is the right device.  Distinct values
// (no ties for top-k); float32 only (bfloat16 would create ties).
class DpGpuCompressed
    : public ::testing::TestWithParam<std::tuple<std::string, double>> {};

TEST_P(DpGpuCompressed, MatchesTheHostReducer) {
  TUTTI_REQUIRE_GPU();
  const std::string algo = std::get<0>(GetParam());
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  const std::vector<test::ParamDecl> decls = {{"w", DType::kFloat32, Shape{100, 30}},
                                              {"b", DType::kFloat32, Shape{30}},
                                              {"v", DType::kFloat32, Shape{257}}};
  CompressorOptions co;
  co.topk_ratio = 0.05;
  co.onebit_chunk = 64;
  co.powersgd_rank = 2;
  ReducerOptions o;
  o.bucket_cap_mb = std::get<1>(GetParam());
  o.compressor = make_compressor(algo, co);
  ReducerOptions host_o = o;
  host_o.compressor = make_compressor(algo, co);
  host_o.name = "host";
  TwinReducers t(dev, decls, host_o, o);
  ASSERT_GT(t.on_dev.buckets().size(), 0u);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(t.step(step, stream.get()));
    for (size_t p = 0; p < decls.size(); ++p) {
      const std::vector<double> want = t.host_params[p].grad.values();
      double scale = 0;
      for (double v : want) scale = std::max(scale, std::fabs(v));
      // PowerSGD: cuBLAS vs OpenBLAS; 1-bit: the scales' summation order
      // (the same bounds as tests/compression/test_compressors_gpu.cc).
      const double tol = (algo == "powersgd" ? 1e-3 : 1e-5) * (1 + scale);
      EXPECT_TRUE(test::matches(t.dev_params[p].grad->download(),
                                [&](int64_t i) { return want[static_cast<size_t>(i)]; },
                                tol))
          << algo << " '" << decls[p].name << "' step " << step;
    }
  }
  EXPECT_EQ(t.on_dev.stats().steps, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, DpGpuCompressed,
    ::testing::Combine(::testing::Values("fp16", "topk", "powersgd", "onebit"),
                       ::testing::Values(1e-9, 1000.0)));

// Where ranks share a GPU the staged transport serves the reducer's CUDA
// buckets: it sums with the host path's MPI ops over a bucket of the same
// length (so MPI splits and orders it alike), and the write-back kernel
// divides as its CPU twin does (UnflattenKernelMatchesCpuTwin above), the
// host reducer's average (a sum, then one division): the averaged CUDA
// gradients equal the host reducer's bit for bit, on values whose sums
// round (float32, bfloat16, float64), over two steps, with one bucket per
// parameter and with one bucket per dtype.  Over NCCL (a GPU per rank) the
// sums run in NCCL's order: skipped there.
TEST(DpGpu, StagedAverageIsTheHostReducersBitForBit) {
  TUTTI_REQUIRE_GPU();
  if (test::gpu_transport() != "staged")
    GTEST_SKIP() << "NCCL serves the CUDA buckets here (its sums run in another order "
                    "than MPI's); bit identity holds over the staged transport";
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  const std::vector<test::ParamDecl> decls = {{"w", DType::kFloat32, Shape{100, 30}},
                                              {"h", DType::kBFloat16, Shape{37}},
                                              {"d", DType::kFloat64, Shape{5}},
                                              {"v", DType::kFloat32, Shape{257}}};
  for (double cap : {1e-9, 1000.0}) {
    ReducerOptions o;
    o.bucket_cap_mb = cap;
    ReducerOptions host_o = o;
    host_o.name = "host";
    TwinReducers t(dev, decls, host_o, o);
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(t.step(step, stream.get()));
      for (size_t p = 0; p < decls.size(); ++p) {
        const Buffer got = t.dev_params[p].grad->download();
        const Buffer& want = t.host_params[p].grad;
        int64_t first = -1;
        for (int64_t i = 0; i < got.numel() && first < 0; ++i)
          if (std::memcmp(got.bytes.data() + i * dtype_size(got.dtype),
                          want.bytes.data() + i * dtype_size(got.dtype), dtype_size(got.dtype)))
            first = i;
        EXPECT_EQ(first, -1) << "'" << decls[p].name << "' step " << step << " cap " << cap
                             << ": the staged CUDA average differs from the host reducer's at "
                             << "element " << first << " (" << got.get(std::max<int64_t>(first, 0))
                             << " vs " << want.get(std::max<int64_t>(first, 0)) << ")";
      }
    }
  }
}

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

// Pooled bucket buffers (set_bucket_collective with one buffer) and
// gradients from two streams.  Registration [a1, a2, b], one float32[256]
// bucket cap: bucket 0 = [b], bucket 1 = [a2, a1].  The hook stands in for
// a slow collective: its stream waits for the bucket's stream, then holds
// 200 ms (a host function), then copies the bucket into a capture.  With one
// buffer, bucket 1's first gradient (stream A) recycles bucket 0's buffer:
// stream A waits for the hook's work and the buffer's release.  Its second
// gradient comes from stream B and holds a sentinel: unless stream B also
// waits for the release, its copy lands in the buffer while the hook still
// holds, and the capture of bucket 0 reads the sentinel.
struct SlowCapture : Work {
  cudaStream_t waiter;
  std::shared_ptr<cuda::Event> done;
  void wait() override { TUTTI_CUDA_CHECK(cudaStreamWaitEvent(waiter, done->get(), 0)); }
  void synchronize() override { TUTTI_CUDA_CHECK(cudaEventSynchronize(done->get())); }
  bool test() override { return done->query(); }
  uint64_t seq() const override { return 0; }
  std::string description() const override { return "slow capture"; }
};

void CUDART_CB hold_200ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

TEST(DpGpu, PooledBufferWrittenFromASecondStreamWaitsForItsRelease) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream a(dev), b(dev), hook_stream(dev);
  const int64_t n = 256;
  const std::vector<test::ParamDecl> decls = {{"a1", DType::kFloat32, Shape{n / 2}},
                                              {"a2", DType::kFloat32, Shape{n / 2}},
                                              {"b", DType::kFloat32, Shape{n}}};
  auto params = gpu_params(dev, decls);
  ReducerOptions o;
  o.bucket_cap_mb = static_cast<double>(n * 4) / (1 << 20);
  o.first_bucket_cap_mb = 0;
  o.learn_bucket_order = false;
  Reducer r(world(), o);
  for (auto& p : params) r.add_parameter(p.name, p.param->tensor(p.shape), p.grad->tensor(p.shape));
  r.build();
  ASSERT_EQ(r.buckets().size(), 2u);
  std::vector<cuda::DeviceBuffer> captures;
  for (int i = 0; i < 2; ++i) captures.emplace_back(dev, n * 4);
  r.set_bucket_collective(
      [&](int index, const Tensor& flat, const OpOptions& opt) -> WorkPtr {
        cuda::DeviceGuard hg(dev);
        cuda::Event ready(dev);
        ready.record(static_cast<cudaStream_t>(opt.stream));
        TUTTI_CUDA_CHECK(cudaStreamWaitEvent(hook_stream.get(), ready.get(), 0));
        TUTTI_CUDA_CHECK(cudaLaunchHostFunc(hook_stream.get(), hold_200ms, nullptr));
        TUTTI_CUDA_CHECK(cudaMemcpyAsync(captures[static_cast<size_t>(index)].data(), flat.data(),
                                         static_cast<size_t>(n * 4), cudaMemcpyDeviceToDevice,
                                         hook_stream.get()));
        auto w = std::make_shared<SlowCapture>();
        w->waiter = static_cast<cudaStream_t>(opt.stream);
        w->done = std::make_shared<cuda::Event>(dev);
        w->done->record(hook_stream.get());
        return w;
      },
      1);
  // b = 1, a2 = 2, a1 = the sentinel 0x7f7f7f7f (3.39e38).
  const float values[] = {0.f, 2.f, 1.f};
  for (size_t p = 0; p < decls.size(); ++p) {
    if (p == 0) {
      TUTTI_CUDA_CHECK(cudaMemset(params[p].grad->mem.data(), 0x7f, params[p].host.bytes.size()));
      continue;
    }
    std::vector<float> h(static_cast<size_t>(params[p].host.numel()), values[p]);
    TUTTI_CUDA_CHECK(cudaMemcpy(params[p].grad->mem.data(), h.data(), h.size() * 4,
                                cudaMemcpyHostToDevice));
  }
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  r.grad_ready(2, a.get());  // b: bucket 0 full, the hook starts holding
  r.grad_ready(1, a.get());  // a2: bucket 1 takes the only buffer
  r.grad_ready(0, b.get());  // a1, from another stream
  ASSERT_TRUE(r.synchronize(a.get()));
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(static_cast<size_t>(n));
  TUTTI_CUDA_CHECK(cudaMemcpy(got.data(), captures[0].data(), n * 4, cudaMemcpyDeviceToHost));
  int64_t wrong = 0;
  for (float v : got) wrong += v != 1.f;
  EXPECT_EQ(wrong, 0) << "bucket 0's collective read " << wrong << " of " << n
                      << " elements written later by bucket 1 from another stream";
  EXPECT_EQ(r.stats().pool_waits, 1);
}

#else

TEST(DpGpu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace tutti
