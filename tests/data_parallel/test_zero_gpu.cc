// CUDA ShardedOptimizer (label gpu; skipped without a device), -np 1 and 2:
// the test model's parameters and gradients on the rank's device, the
// reducer on NCCL with a user stream, stages 1 and 2 (and the float16
// reduce-scatter), against the same training on the host (MPI, host
// optim::step).  Bit-identical for float32 at W <= 2 (the CUDA optimizer
// kernel matches its host twin bit for bit, a sum of two values does not
// depend on order, and halving is exact), except the float16 wire (one
// rounding of the gradients in another order: within 1e-6 absolute).  ctest
// runs gpu tests under TUTTI_CHECK_DEVICE=1 (tests/CMakeLists.txt), so a
// thread that launches on the wrong device fails.
#include <gtest/gtest.h>

#include <exception>
#include <memory>
#include <thread>

#include "core/cuda_utils.h"
#include "data_parallel/test_zero_util.h"

namespace tutti {
namespace {

#if TUTTI_WITH_CUDA

using test::ZeroConfig;
using test::ZeroModel;

int my_device() { return local_rank() % cuda_device_count(); }

// The test model on a device: parameters uploaded from the host model's
// initial values, trained with a CUDA reducer and ShardedOptimizer.
struct DeviceModel {
  std::vector<cuda::DeviceBuffer> params, grads;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<ShardedOptimizer> zero;

  DeviceModel(ZeroModel& host, const ZeroConfig& c, int dev) {
    ReducerOptions o;
    o.bucket_cap_mb = 120.0 / (1 << 20);
    o.first_bucket_cap_mb = 0;
    o.learn_bucket_order = false;
    reducer.reset(new Reducer(world(), o));
    for (auto& p : host.params) {
      const size_t bytes = p.param.bytes.size();
      params.emplace_back(dev, bytes);
      grads.emplace_back(dev, bytes);
      cuda::copy_to_device_sync(params.back().data(), p.param.bytes.data(), bytes);
      reducer->add_parameter(p.name, Tensor(params.back().data(), p.param.dtype, p.shape,
                                            Device::cuda(dev)),
                             Tensor(grads.back().data(), p.param.dtype, p.shape, Device::cuda(dev)));
    }
    reducer->build();
    ShardedOptimizerOptions zo;
    zo.stage = c.stage;
    zo.reduce_dtype = c.reduce_dtype;
    zero.reset(new ShardedOptimizer(*reducer, c.hyper, zo));
  }

  std::vector<double> values(const ZeroModel& host) const {
    std::vector<double> out;
    for (size_t p = 0; p < params.size(); ++p) {
      test::Buffer b(host.params[p].param.dtype, host.params[p].shape.numel());
      TUTTI_CUDA_CHECK(cudaMemcpy(b.bytes.data(), params[p].data(), b.bytes.size(),
                                  cudaMemcpyDeviceToHost));
      const std::vector<double> v = b.values();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

TEST(ZeroGpu, MatchesHostTraining) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  for (optim::Kind kind : {optim::Kind::kSgd, optim::Kind::kAdamW})
    for (int stage : {1, 2})
      for (DType wire : {DType::kFloat32, DType::kFloat16}) {
        if (stage == 1 && wire != DType::kFloat32) continue;
        ZeroConfig c;
        c.hyper = test::test_hyper(kind);
        c.stage = stage;
        c.reduce_dtype = wire;
        SCOPED_TRACE(std::string(optim::kind_name(kind)) + " stage " + std::to_string(stage) +
                     " wire " + dtype_name(wire));
        ZeroModel host(world(), c);
        DeviceModel d(host, c, dev);
        for (int64_t t = 1; t <= 3; ++t) {
          ASSERT_TRUE(host.backward(t));
          host.step();
          for (int p = static_cast<int>(host.params.size()) - 1; p >= 0; --p) {
            test::Buffer b(host.params[static_cast<size_t>(p)].param.dtype,
                           host.params[static_cast<size_t>(p)].shape.numel());
            const std::vector<double> v = host.local_gradient(p, t);
            convert(v.data(), DType::kFloat64, b.bytes.data(), b.dtype, v.size());
            TUTTI_CUDA_CHECK(cudaMemcpyAsync(d.grads[static_cast<size_t>(p)].data(), b.bytes.data(),
                                             b.bytes.size(), cudaMemcpyHostToDevice,
                                             stream.get()));
            TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));  // b goes out of scope
            d.reducer->grad_ready(p, stream.get());
          }
          ASSERT_TRUE(d.reducer->synchronize(stream.get()));
          d.zero->step(1.f, stream.get());
          TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
          const double diff = test::max_abs_diff(d.values(host), host.param_values());
          if (wire == DType::kFloat32)
            EXPECT_EQ(diff, 0.0) << "step " << t;
          else
            EXPECT_LE(diff, 1e-6) << "step " << t;
        }
      }
}

// The optimizer built on a thread that never set its device (threads start
// on device 0 without tutti knowing it): its setup casts the parameters into
// the master weights on the bucket's device, under its own guard.  Under
// TUTTI_CHECK_DEVICE=1 (ctest's gpu tests) a launch from a thread that did
// not set its device through tutti fails, so a missing guard shows even on
// a one-GPU machine.  Then one step matches the host's, so the master
// weights started from the parameters.
TEST(ZeroGpu, BuiltOnAThreadThatSetNoDevice) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  ZeroConfig c;
  c.hyper = test::test_hyper(optim::Kind::kAdamW);
  c.stage = 2;
  ZeroModel host(world(), c);
  std::unique_ptr<DeviceModel> d;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      d.reset(new DeviceModel(host, c, dev));
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      FAIL() << "building on a thread with no device set: " << e.what();
    }
  }
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  ASSERT_TRUE(host.backward(1));
  host.step();
  for (int p = static_cast<int>(host.params.size()) - 1; p >= 0; --p) {
    test::Buffer b(host.params[static_cast<size_t>(p)].param.dtype,
                   host.params[static_cast<size_t>(p)].shape.numel());
    const std::vector<double> v = host.local_gradient(p, 1);
    convert(v.data(), DType::kFloat64, b.bytes.data(), b.dtype, v.size());
    // Landed before the reducer reads it on `stream` (non-blocking): a plain
    // cudaMemcpy from pageable memory may return before its DMA lands.
    // With that plain copy this test failed once on an H100 (2026-11-27,
    // parameters 0.02 off after one AdamW step) and passed in the three runs
    // after this change; the copy race itself did not show in a direct test
    // on the same machine (test_device_gpu's CopyToDeviceGpu), so the cause
    // is not established: scripts/gpu_check.sh repeats this test.
    cuda::copy_to_device_sync(d->grads[static_cast<size_t>(p)].data(), b.bytes.data(),
                              b.bytes.size());
    d->reducer->grad_ready(p, stream.get());
  }
  ASSERT_TRUE(d->reducer->synchronize(stream.get()));
  d->zero->step(1.f, stream.get());
  TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(test::max_abs_diff(d->values(host), host.param_values()), 0.0);
}

// As MatchesHostTraining (AdamW, stage 2, pooled bucket buffers), but with
// every gradient uploaded first and then handed over by grad_ready() back to
// back, with no host synchronisation between them: the reducer's own
// ordering (pooled buffers recycled between buckets, copies on the
// caller's stream) is all that keeps the buckets apart.  MatchesHostTraining
// synchronises the stream after each upload, which would hide a race there
// (a suspect for BuiltOnAThreadThatSetNoDevice's one failure).
TEST(ZeroGpu, GradReadyBackToBackMatchesHostTraining) {
  TUTTI_REQUIRE_GPU();
  const int dev = my_device();
  cuda::DeviceGuard g(dev);
  cuda::Stream stream(dev);
  for (int stage : {1, 2}) {
    ZeroConfig c;
    c.hyper = test::test_hyper(optim::Kind::kAdamW);
    c.stage = stage;
    SCOPED_TRACE("stage " + std::to_string(stage));
    ZeroModel host(world(), c);
    DeviceModel d(host, c, dev);
    for (int64_t t = 1; t <= 3; ++t) {
      ASSERT_TRUE(host.backward(t));
      host.step();
      for (size_t p = 0; p < host.params.size(); ++p) {
        test::Buffer b(host.params[p].param.dtype, host.params[p].shape.numel());
        const std::vector<double> v = host.local_gradient(static_cast<int>(p), t);
        convert(v.data(), DType::kFloat64, b.bytes.data(), b.dtype, v.size());
        cuda::copy_to_device_sync(d.grads[p].data(), b.bytes.data(), b.bytes.size());
      }
      for (int p = static_cast<int>(host.params.size()) - 1; p >= 0; --p)
        d.reducer->grad_ready(p, stream.get());
      ASSERT_TRUE(d.reducer->synchronize(stream.get()));
      d.zero->step(1.f, stream.get());
      TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      EXPECT_EQ(test::max_abs_diff(d.values(host), host.param_values()), 0.0) << "step " << t;
    }
  }
}

#else

TEST(ZeroGpu, NotBuilt) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace tutti
